// facefuse playground, live panel: the camera fused in real time over WebRTC
// (POST /v1/live with the SDP offer, WHIP style), the fused stream shown beside the
// camera, the degree changed mid-session on a data channel, fps and latency shown.
// Plain JavaScript, no build step. Reuses the page's API key, source photo and
// template; adds its own panel to <main>.
"use strict";

(() => {
  // app.js's api(): the key's Bearer header, and an error's "code: message" thrown.
  const byId = (id) => document.getElementById(id);

  const panel = document.createElement("section");
  panel.className = "panel result";
  panel.setAttribute("aria-labelledby", "h-live");
  panel.innerHTML = `
    <h2 id="h-live">Live (camera)</h2>
    <p class="note">Fuses the source face of step 1 (or the chosen template) into your
      camera, live. The camera stays in this page until you press Start.</p>
    <label class="slider">Degree <output id="live-degree-out">80</output>
      <input id="live-degree" type="range" min="0" max="100" step="1" value="80"></label>
    <label class="row"><input id="live-audio" type="checkbox"> send the microphone too
      (it comes back with the fused video)</label>
    <button id="live-start" type="button">Start</button>
    <button id="live-stop" type="button" class="secondary" hidden>Stop</button>
    <p id="live-status" role="status" aria-live="polite"></p>
    <div class="live-grid">
      <figure><video id="live-camera" autoplay muted playsinline></video>
        <figcaption>camera</figcaption></figure>
      <figure><video id="live-fused" autoplay playsinline></video>
        <figcaption>fused</figcaption></figure>
    </div>
    <dl id="live-figures" class="facts">
      <dt>fps shown</dt><dd id="live-fps">–</dd>
      <dt>server latency p50 / p95</dt><dd id="live-latency">–</dd>
      <dt>frames dropped</dt><dd id="live-dropped">–</dd>
    </dl>`;
  document.querySelector("main").append(panel);

  let pc = null;
  let camera = null;
  let channel = null;
  let location = null;
  let shown = 0;
  let shownAt = [];
  const say = (text, isError = false) => {
    byId("live-status").textContent = text;
    byId("live-status").className = isError ? "error" : "";
  };
  const running = (on) => {
    byId("live-start").hidden = on;
    byId("live-stop").hidden = !on;
  };

  byId("live-degree").addEventListener("input", () => {
    const degree = Number(byId("live-degree").value);
    byId("live-degree-out").textContent = degree;
    if (channel && channel.readyState === "open") channel.send(JSON.stringify({ degree }));
  });

  // The source: the photo of step 1, uploaded once, or the chosen template.
  async function sourceParams() {
    const file = byId("source-file").files[0];
    if (file) {
      const form = new FormData();
      form.append("source", file);
      const response = await api("/v1/live/sources", { method: "POST", body: form });
      return { source_id: (await response.json()).id };
    }
    const template = byId("template").value;
    if (template) return { template };
    throw new Error("pick a source photo (step 1) or a template first");
  }

  function gathered(peer) {
    if (peer.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      peer.addEventListener("icegatheringstatechange", () => {
        if (peer.iceGatheringState === "complete") resolve();
      });
    });
  }

  function countFrames(video) {
    const tick = () => {
      if (!pc) return;
      shown += 1;
      const now = performance.now();
      shownAt.push(now);
      shownAt = shownAt.filter((t) => now - t < 2000);
      video.dataset.frames = String(shown);
      video.requestVideoFrameCallback(tick);
    };
    video.requestVideoFrameCallback(tick);
  }

  function showStats(s) {
    const fps = shownAt.length > 1 ?
      (shownAt.length - 1) * 1000 / (shownAt[shownAt.length - 1] - shownAt[0]) : 0;
    byId("live-fps").textContent = fps.toFixed(1) + " (server out " + s.fps_out + ", camera " +
      s.fps_in + ")";
    byId("live-latency").textContent = s.latency_p50_ms === null ? "–" :
      s.latency_p50_ms + " / " + s.latency_p95_ms + " ms";
    byId("live-dropped").textContent = s.frames_dropped + " of " + s.frames_in;
  }

  async function start() {
    byId("live-start").disabled = true;
    try {
      say("Opening the camera…");
      camera = await navigator.mediaDevices.getUserMedia({
        video: { width: { ideal: 640 }, height: { ideal: 480 } },
        audio: byId("live-audio").checked });
      byId("live-camera").srcObject = camera;
      const params = await sourceParams();
      params.degree = byId("live-degree").value;
      pc = new RTCPeerConnection();
      for (const track of camera.getTracks()) pc.addTrack(track, camera);
      channel = pc.createDataChannel("control");
      channel.onmessage = (event) => {
        const m = JSON.parse(event.data);
        if (m.type === "stats") showStats(m);
        else if (m.type === "error") say(m.code + ": " + m.message, true);
      };
      const fused = byId("live-fused");
      pc.ontrack = (event) => {
        if (event.track.kind !== "video") return;
        fused.srcObject = event.streams[0] || new MediaStream([event.track]);
        countFrames(fused);
      };
      pc.onconnectionstatechange = () => {
        if (pc && pc.connectionState === "failed") say("The connection failed.", true);
      };
      await pc.setLocalDescription(await pc.createOffer());
      await gathered(pc);
      say("Starting the session…");
      const response = await api("/v1/live?" + new URLSearchParams(params), {
        method: "POST", body: pc.localDescription.sdp,
        headers: { "Content-Type": "application/sdp" } });
      location = response.headers.get("Location");
      panel.dataset.session = location;
      await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
      running(true);
      say("Live.");
    } catch (error) {
      say(String(error.message || error), true);
      await stop(false);
    } finally {
      byId("live-start").disabled = false;
    }
  }

  async function stop(tell = true) {
    const ending = location;
    location = null;
    delete panel.dataset.session;
    if (channel) channel.close();
    if (pc) pc.close();
    if (camera) camera.getTracks().forEach((t) => t.stop());
    pc = channel = camera = null;
    shown = 0;
    shownAt = [];
    running(false);
    if (ending) {
      try {
        await api(ending, { method: "DELETE" });
        if (tell) say("Stopped.");
      } catch (error) {  // 404: it had ended already (reaped)
        const gone = String(error.message).startsWith("live_session_not_found");
        if (tell) say(gone ? "Stopped." : error.message, !gone);
      }
    }
    panel.dataset.stopped = "true";
  }

  byId("live-start").addEventListener("click", start);
  byId("live-stop").addEventListener("click", () => stop());
  window.addEventListener("pagehide", () => { if (location) stop(false); });
})();
