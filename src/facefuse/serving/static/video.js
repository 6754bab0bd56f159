// facefuse playground, video panel: a clip fused as a job (POST /v1/jobs), its
// progress polled, the result played in the page. Plain JavaScript, no build step.
// Reuses the page's API key field and source photo; adds its own panel to <main>.
"use strict";

(() => {
  const byId = (id) => document.getElementById(id);
  const headers = () => {
    const key = byId("key").value.trim();
    return key ? { Authorization: "Bearer " + key } : {};
  };
  const errorText = async (response) => {
    try {
      const body = await response.json();
      return body.error.code + ": " + body.error.message;
    } catch (_) {
      return "HTTP " + response.status;
    }
  };

  const panel = document.createElement("section");
  panel.className = "panel";
  panel.setAttribute("aria-labelledby", "h-video");
  panel.innerHTML = `
    <h2 id="h-video">Video (a job)</h2>
    <p class="note">Uses the source face of step 1 and the degree of step 3.</p>
    <label class="drop"><span>Choose a clip (mp4, mov, mkv, webm)</span>
      <input id="clip-file" type="file" accept="video/*"></label>
    <button id="video-fuse" type="button" disabled>Fuse the clip</button>
    <button id="video-cancel" type="button" hidden>Cancel</button>
    <progress id="video-progress" max="100" value="0" hidden style="width:100%"></progress>
    <p id="video-status" role="status" aria-live="polite"></p>
    <video id="video-result" controls hidden style="max-width:100%"></video>
    <a id="video-download" class="button" hidden download="facefuse.mp4">Download</a>`;
  document.querySelector("main").append(panel);

  let job = null;
  let resultUrl = null;
  const say = (text, isError = false) => {
    byId("video-status").textContent = text;
    byId("video-status").className = isError ? "error" : "";
  };
  const ready = () => {
    byId("video-fuse").disabled = !(byId("source-file").files.length &&
                                    byId("clip-file").files.length) || job !== null;
  };
  byId("clip-file").addEventListener("change", ready);
  byId("source-file").addEventListener("change", ready);

  async function poll() {
    if (job === null) return;
    const response = await fetch(job, { headers: headers() });
    if (!response.ok) {
      say(await errorText(response), true);
      job = null;
      return ready();
    }
    const body = await response.json();
    const p = body.progress;
    byId("video-progress").value = p.percent;
    if (body.status === "queued") say("Queued…");
    if (body.status === "running") {
      say(`Fusing: ${p.frames_done}/${p.frames_total} frames, ${p.fps} fps` +
          (p.eta_s !== undefined ? `, about ${Math.ceil(p.eta_s)} s left` : ""));
    }
    if (body.status === "succeeded") return show(body);
    if (body.status === "failed" || body.status === "cancelled") {
      say(body.status === "failed" ? body.error.code + ": " + body.error.message : "Cancelled.",
          body.status === "failed");
      return finish();
    }
    setTimeout(poll, 1000);
  }

  async function show(body) {
    const response = await fetch(body.result.url, { headers: headers() });
    if (!response.ok) {
      say(await errorText(response), true);
      return finish();
    }
    if (resultUrl) URL.revokeObjectURL(resultUrl);
    resultUrl = URL.createObjectURL(await response.blob());
    const video = byId("video-result");
    video.src = resultUrl;
    video.hidden = false;
    byId("video-download").href = resultUrl;
    byId("video-download").hidden = false;
    say(`Done: ${body.report.frames} frames (${body.report.fused_frames} fused), ` +
        `${body.report.fps} fps.`);
    finish();
  }

  function finish() {
    job = null;
    byId("video-cancel").hidden = true;
    ready();
  }

  byId("video-fuse").addEventListener("click", async () => {
    const form = new FormData();
    form.append("source", byId("source-file").files[0]);
    form.append("clip", byId("clip-file").files[0]);
    form.append("degree", byId("degree").value);
    say("Uploading…");
    const response = await fetch("/v1/jobs", { method: "POST", body: form, headers: headers() });
    if (response.status !== 202) return say(await errorText(response), true);
    job = response.headers.get("Location");
    byId("video-progress").hidden = false;
    byId("video-cancel").hidden = false;
    ready();
    poll();
  });

  byId("video-cancel").addEventListener("click", async () => {
    if (job !== null) await fetch(job, { method: "DELETE", headers: headers() });
  });
})();
