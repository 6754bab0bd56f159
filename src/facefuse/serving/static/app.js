// facefuse playground: plain JavaScript over the HTTP API, no build step, no CDN.
// The API key lives only in this page's memory and goes out as a Bearer header.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { source: null, target: null, template: "", faces: [], face: 0, caps: null,
                touched: { shape: false, texture: false }, resultUrl: null, zoomed: false };

function authHeaders() {
  const key = $("key").value.trim();
  return key ? { Authorization: "Bearer " + key } : {};
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options,
                                      headers: { ...authHeaders(), ...options.headers } });
  if (!response.ok) {
    let message = "HTTP " + response.status;
    try {
      const body = await response.json();
      message = body.error.code + ": " + body.error.message;
    } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

function say(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

function ready() {
  $("fuse").disabled = !(state.source && (state.target || state.template) && state.faces.length);
}

async function loadCapabilities() {
  try {
    state.caps = await (await api("/v1/capabilities")).json();
    const list = await (await api("/v1/templates")).json();
    const select = $("template");
    select.length = 1;
    for (const t of list.templates) {
      const option = document.createElement("option");
      option.value = t.id;
      option.textContent = (t.name || t.id.slice(0, 8)) + " (" + t.faces + " face" +
        (t.faces === 1 ? "" : "s") + ")";
      select.append(option);
    }
  } catch (err) {
    say("Server: " + err.message + (String(err.message).startsWith("unauthorized") ?
      " — enter an API key above." : ""), true);
  }
}

function showFaces(faces, width, height) {
  state.faces = faces;
  state.face = 0;
  const box = $("faces");
  box.replaceChildren();
  faces.forEach((face, i) => {
    const [x0, y0, x1, y1] = face.bbox;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "face";
    button.id = "face-" + i;
    button.style.left = (100 * x0 / width) + "%";
    button.style.top = (100 * y0 / height) + "%";
    button.style.width = (100 * (x1 - x0) / width) + "%";
    button.style.height = (100 * (y1 - y0) / height) + "%";
    button.setAttribute("aria-pressed", String(i === 0));
    // numbered from 0, largest first: the target_face_index the API takes
    button.setAttribute("aria-label", "Replace face " + i + (i === 0 ? " (largest)" : ""));
    const tag = document.createElement("span");
    tag.textContent = String(i);
    button.append(tag);
    button.addEventListener("click", () => chooseFace(i));
    box.append(button);
  });
  $("face-note").textContent = faces.length ?
    faces.length + " face(s) found; face " + state.face + " will be replaced." :
    "No face found in the target.";
  ready();
}

function chooseFace(i) {
  state.face = i;
  document.querySelectorAll(".face").forEach((b, j) =>
    b.setAttribute("aria-pressed", String(i === j)));
  $("face-note").textContent = state.faces.length + " face(s) found; face " + i +
    " will be replaced.";
}

async function setTarget(file) {
  state.target = file;
  state.template = "";
  $("template").value = "";
  $("target-preview").src = URL.createObjectURL(file);
  $("stage").hidden = false;
  say("Finding faces…");
  try {
    const form = new FormData();
    form.append("image", file);
    const body = await (await api("/v1/faces", { method: "POST", body: form })).json();
    showFaces(body.faces, body.width, body.height);
    say(body.faces.length ? "Choose a face, set the sliders, then Fuse." : "No face in the target.");
  } catch (err) {
    showFaces([], 1, 1);
    say(err.message, true);
  }
}

async function setTemplate(id) {
  state.template = id;
  state.target = null;
  if (!id) { $("stage").hidden = true; showFaces([], 1, 1); return; }
  try {
    const t = await (await api("/v1/templates/" + id)).json();
    const image = await (await api("/v1/templates/" + id + "/image")).blob();
    $("target-preview").src = URL.createObjectURL(image);
    $("stage").hidden = false;
    showFaces(t.faces, t.width, t.height);
  } catch (err) {
    say(err.message, true);
  }
}

function setSource(file) {
  state.source = file;
  $("source-preview").src = URL.createObjectURL(file);
  $("source-preview").hidden = false;
  ready();
}

function fact(list, name, value) {
  const dt = document.createElement("dt");
  dt.textContent = name;
  const dd = document.createElement("dd");
  dd.textContent = value;
  list.append(dt, dd);
}

function showTimings(list, header) {
  // Server-Timing: "decode;dur=3.1, detect;dur=20.4, ..." -> one row per stage
  for (const part of header.split(",")) {
    const [stage, dur] = part.trim().split(";dur=");
    if (stage && dur !== undefined && stage !== "total") {
      fact(list, stage + " (ms)", String(Math.round(Number(dur))));
    }
  }
}

async function fuse() {
  const form = new FormData();
  form.append("source", state.source);
  for (const name of ["degree", "shape", "texture"]) form.append(name, $(name).value);
  form.append("target_face_index", String(state.face));
  form.append("format", $("format").value);
  form.append("similarity", "true");
  let path = "/v1/fuse";
  if (state.template) path = "/v1/templates/" + state.template + "/fuse";
  else form.append("target", state.target);
  $("fuse").disabled = true;
  say("Fusing…");
  const t0 = performance.now();
  try {
    const response = await api(path, { method: "POST", body: form });
    const blob = await response.blob();
    const roundTrip = performance.now() - t0;
    if (state.resultUrl) URL.revokeObjectURL(state.resultUrl);
    state.resultUrl = URL.createObjectURL(blob);
    state.fusedFace = state.faces[state.face];
    $("before").src = $("target-preview").src;
    const img = $("result");
    img.src = state.resultUrl;
    await Promise.all([$("before").decode(), img.decode()]).catch(() => {});
    $("outcome").hidden = false;
    layoutZoom();
    const link = $("download");
    link.href = state.resultUrl;
    link.download = "facefuse." + ($("format").value === "jpeg" ? "jpg" : $("format").value);
    const sim = response.headers.get("X-Facefuse-Identity-Similarity");
    $("similarity").textContent = sim ? Number(sim).toFixed(3) : "–";
    const timing = response.headers.get("Server-Timing") || "";
    const total = /(?:^|,)\s*total;dur=([\d.]+)/.exec(timing);
    $("total").textContent = (total ? Math.round(Number(total[1])) + " ms on the server, " : "") +
      Math.round(roundTrip) + " ms round trip";
    const facts = $("facts");
    facts.replaceChildren();
    fact(facts, "face", String(state.face) + (state.face === 0 ? " (largest)" : ""));
    fact(facts, "size", img.naturalWidth + " × " + img.naturalHeight + " px, " +
      Math.round(blob.size / 1024) + " KiB " + $("format").value);
    fact(facts, "cache", response.headers.get("X-Facefuse-Cache") || "-");
    showTimings(facts, timing);
    const prov = state.caps && state.caps.provenance;
    if (prov) {
      fact(facts, "provenance", prov.xmp ?
        "XMP digital source type: " + prov.digital_source_type.split("/").pop() : "none");
      fact(facts, "visible label", prov.label.enabled ? prov.label.text : "off");
      fact(facts, "C2PA", prov.c2pa.enabled ? "signed" : "not configured");
    }
    say("Done.");
  } catch (err) {
    say(err.message, true);
  } finally {
    ready();
  }
}

function setSplit(value) {
  // the divider at `value` % from the left: the target before it, the result after it
  $("compare-stage").style.setProperty("--split", value + "%");
}

function layoutZoom() {
  // 1:1 = one image pixel per device pixel, scrolled to the fused face; otherwise fit
  const stage = $("compare-stage");
  const view = $("viewport");
  const img = $("result");
  const zoom = $("zoom");
  zoom.setAttribute("aria-pressed", String(state.zoomed));
  zoom.textContent = state.zoomed ? "Fit to the panel" : "1:1 on the face";
  view.classList.toggle("zoomed", state.zoomed);
  if (!state.zoomed || !img.naturalWidth) {
    stage.style.width = "";
    return;
  }
  const scale = 1 / (window.devicePixelRatio || 1);
  stage.style.width = (img.naturalWidth * scale) + "px";
  const face = state.fusedFace;
  if (face) {
    const [x0, y0, x1, y1] = face.bbox;
    view.scrollLeft = Math.max(0, ((x0 + x1) / 2) * scale - view.clientWidth / 2);
    view.scrollTop = Math.max(0, ((y0 + y1) / 2) * scale - view.clientHeight / 2);
  }
}

function dropZone(zone, input, handle) {
  input.addEventListener("change", () => input.files[0] && handle(input.files[0]));
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    if (e.dataTransfer.files[0]) handle(e.dataTransfer.files[0]);
  });
}

function slider(name) {
  const input = $(name);
  input.addEventListener("input", () => {
    $(name + "-out").textContent = input.value;
    if (name === "degree") {
      for (const other of ["shape", "texture"]) {
        if (!state.touched[other]) {
          $(other).value = input.value;
          $(other + "-out").textContent = input.value;
        }
      }
    } else {
      state.touched[name] = true;
    }
  });
}

dropZone($("source-drop"), $("source-file"), setSource);
dropZone($("target-drop"), $("target-file"), setTarget);
$("template").addEventListener("change", (e) => setTemplate(e.target.value));
["degree", "shape", "texture"].forEach(slider);
$("fuse").addEventListener("click", fuse);
$("compare").addEventListener("input", (e) => setSplit(e.target.value));
$("zoom").addEventListener("click", () => { state.zoomed = !state.zoomed; layoutZoom(); });
window.addEventListener("resize", () => state.zoomed && layoutZoom());
$("key").addEventListener("change", loadCapabilities);
loadCapabilities();
