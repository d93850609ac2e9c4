// The omnistage playground. Plain JavaScript, no build step: it reads /v1/models and offers each panel
// to the models whose capabilities allow it, and talks only to the server that served it.
"use strict";

const KEY_STORAGE = "omnistage.apiKey";
const $ = (root, selector) => root.querySelector(selector);

// ---- the API ---------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(message, param = null, status = 0) {
    super(message);
    this.param = param;
    this.status = status;
  }
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** fetch on this server; a non-2xx answer becomes an ApiError carrying the API's message and field. */
async function api(path, { method = "GET", json, form } = {}) {
  const headers = authHeaders();
  let body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (form !== undefined) {
    body = form;
  }
  const response = await fetch(path, { method, headers, body });
  if (!response.ok) throw await errorOf(response);
  return response;
}

async function errorOf(response) {
  const text = await response.text();
  try {
    const error = JSON.parse(text).error;
    if (error && error.message) return new ApiError(error.message, error.param, response.status);
  } catch (_) {
    // not the error envelope: fall through to the raw text
  }
  return new ApiError(`${response.status} ${response.statusText}: ${text.slice(0, 300)}`, null, response.status);
}

/** The JSON payloads of a server-sent event stream, as they arrive; an error event throws. */
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("");
      if (!data || data === "[DONE]") continue;
      const payload = JSON.parse(data);
      if (payload.error) throw new ApiError(payload.error.message, payload.error.param, payload.error.code);
      yield payload;
    }
  }
}

// ---- errors next to the control that caused them ---------------------------------------------------

function clearErrors(root) {
  for (const el of root.querySelectorAll(".error")) el.textContent = "";
}

/** The API names the field (`param`); its message goes beside that field, else beside the button. */
function showError(panel, button, error) {
  const param = error instanceof ApiError ? error.param : null;
  let slot = null;
  if (param) {
    const fields = [...panel.querySelectorAll(".field[data-param]")];
    const base = param.split(/[.[]/)[0];
    const field = fields.find((f) => f.dataset.param === param) || fields.find((f) => f.dataset.param === base);
    slot = field && !field.hidden ? $(field, ".error") : null;
  }
  slot = slot || $(panel, `.error[data-for="${button}"]`) || $(panel, '.field[data-param="model"] .error');
  slot.textContent = error.message;
}

/** Runs `work` for a button: disables it meanwhile, shows any error next to the right control. */
function action(panel, name, work) {
  const button = $(panel, `button[name="${name}"]`);
  button.addEventListener("click", async () => {
    clearErrors(panel);
    button.disabled = true;
    try {
      await work();
    } catch (error) {
      showError(panel, name, error);
    } finally {
      button.disabled = false;
    }
  });
}

// ---- audio: WAV chunks played as they arrive, joined into one file ---------------------------------

function base64Bytes(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** {rate, channels, bits, pcm} of a PCM WAV (the chunk's header may declare an open length). */
function parseWav(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let offset = 12;
  let format = null;
  while (offset + 8 <= bytes.length) {
    const id = String.fromCharCode(...bytes.subarray(offset, offset + 4));
    const size = view.getUint32(offset + 4, true);
    if (id === "fmt ") {
      format = { channels: view.getUint16(offset + 10, true), rate: view.getUint32(offset + 12, true),
        bits: view.getUint16(offset + 22, true) };
    } else if (id === "data") {
      return { ...format, pcm: bytes.subarray(offset + 8, Math.min(bytes.length, offset + 8 + size)) };
    }
    offset += 8 + size;
  }
  throw new Error("not a PCM WAV");
}

function wavBlob(pcmParts, rate, channels = 1, bits = 16) {
  const length = pcmParts.reduce((n, p) => n + p.length, 0);
  const header = new DataView(new ArrayBuffer(44));
  const text = (at, s) => [...s].forEach((c, i) => header.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF");
  header.setUint32(4, 36 + length, true);
  text(8, "WAVEfmt ");
  header.setUint32(16, 16, true);
  header.setUint16(20, 1, true);
  header.setUint16(22, channels, true);
  header.setUint32(24, rate, true);
  header.setUint32(28, (rate * channels * bits) / 8, true);
  header.setUint16(32, (channels * bits) / 8, true);
  header.setUint16(34, bits, true);
  text(36, "data");
  header.setUint32(40, length, true);
  return new Blob([header, ...pcmParts], { type: "audio/wav" });
}

let audioContext = null;
function sharedAudioContext() {
  audioContext = audioContext || new AudioContext();
  if (audioContext.state === "suspended") audioContext.resume();
  return audioContext;
}

/** Plays PCM16 chunks back to back as they arrive and keeps them for the finished file. */
class StreamPlayer {
  constructor(onPlayed = null) {
    this.context = sharedAudioContext();
    this.next = 0;
    this.parts = [];
    this.rate = 0;
    this.chunks = 0;
    this.sources = new Set();
    this.onPlayed = onPlayed; // called with the samples of each chunk once it has played out
  }

  push(pcm, rate) {
    this.rate = rate;
    this.parts.push(pcm);
    this.chunks += 1;
    const samples = new Int16Array(pcm.buffer.slice(pcm.byteOffset, pcm.byteOffset + (pcm.length & ~1)));
    if (!samples.length) return;
    const buffer = this.context.createBuffer(1, samples.length, rate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32768;
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    source.onended = () => {
      this.sources.delete(source);
      if (this.onPlayed) this.onPlayed(samples.length);
    };
    this.sources.add(source);
    this.next = Math.max(this.next, this.context.currentTime);
    source.start(this.next);
    this.next += buffer.duration;
  }

  /** Silences what is playing or scheduled (barge-in); returns how many chunks it cut. */
  stop() {
    const cut = this.sources.size;
    for (const source of this.sources) {
      source.onended = null;
      source.stop();
    }
    this.sources.clear();
    this.next = 0;
    return cut;
  }

  blob() {
    return wavBlob(this.parts, this.rate);
  }
}

function audioElement(blob, filename) {
  const wrap = document.createElement("div");
  wrap.className = "audio";
  const audio = document.createElement("audio");
  audio.controls = true;
  audio.src = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = audio.src;
  link.download = filename;
  link.textContent = "Download";
  wrap.append(audio, link);
  return wrap;
}

// ---- models and their panels -----------------------------------------------------------------------

function capabilitiesOf(model) {
  const caps = model.omnistage || {};
  return {
    routes: caps.routes || model.routes || [],
    modalities: caps.modalities || model.modalities || [],
    limits: caps.limits || {},
    voices: caps.voices || [],
    speedRange: caps.speed_range || null,
  };
}

// Which models each panel is offered to, read from the capabilities only.
const OFFERS = {
  chat: (c) => c.routes.includes("chat") && (c.modalities.includes("text") || c.modalities.includes("image")),
  speech: (c) => c.routes.includes("speech"),
  images: (c) => c.routes.includes("images"),
  video: (c) => c.routes.includes("videos"),
  live: (c) => c.routes.includes("realtime"),
};

const models = new Map();

function panel(name) {
  return document.getElementById(`panel-${name}`);
}

function selectedModel(root) {
  const name = $(root, 'select[name="model"]').value;
  return { name, caps: capabilitiesOf(models.get(name)) };
}

function numberField(root, name) {
  const input = $(root, `[name="${name}"]`);
  return input.value === "" ? undefined : Number(input.value);
}

function fillSelect(select, values, labels = values) {
  select.replaceChildren(...values.map((v, i) => new Option(labels[i], v)));
}

/** Sizes within the model's limits (the server's caps included), smallest first. */
function sizesWithin(limits) {
  const sides = [32, 64, 128, 256, 512, 768, 1024, 1536, 2048];
  const sizes = [];
  for (const w of sides) {
    for (const h of sides) {
      if (Math.max(w, h) > 2 * Math.min(w, h)) continue;
      if (limits.max_width && w > limits.max_width) continue;
      if (limits.max_height && h > limits.max_height) continue;
      if (limits.max_pixels && w * h > limits.max_pixels) continue;
      sizes.push([w, h]);
    }
  }
  sizes.sort((a, b) => a[0] * a[1] - b[0] * b[1] || b[0] - a[0]);
  return sizes.map(([w, h]) => `${w}x${h}`);
}

function setMax(root, name, max) {
  const input = $(root, `[name="${name}"]`);
  if (max) input.max = String(max);
  else input.removeAttribute("max");
}

const onModelChange = {
  chat(root, caps) {
    $(root, ".speaks").hidden = !caps.modalities.includes("audio");
    // A model that draws: its answer may be a picture; one that cannot write always answers with one.
    const draw = $(root, '[name="draw"]');
    $(root, ".draws").hidden = !caps.modalities.includes("image");
    draw.disabled = !caps.modalities.includes("text");
    draw.checked = draw.disabled;
    setMax(root, "max_tokens", caps.limits.max_output_tokens);
  },
  async speech(root, caps, name) {
    const [low, high] = caps.speedRange || [0.25, 4];
    Object.assign($(root, '[name="speed"]'), { min: String(low), max: String(high) });
    const listing = await (await api(`/v1/audio/voices?model=${encodeURIComponent(name)}`)).json();
    const own = listing.models.length ? listing.models[0] : { voices: [], clones_voices: false };
    const uploaded = own.clones_voices ? listing.uploaded_voices.map((v) => v.name) : [];
    const voices = [...own.voices, ...uploaded];
    fillSelect($(root, '[name="voice"]'), ["", ...voices], ["(model default)", ...voices]);
  },
  images(root, caps) {
    fillSelect($(root, '[name="size"]'), ["", ...sizesWithin(caps.limits)], ["(model default)", ...sizesWithin(caps.limits)]);
    setMax(root, "num_inference_steps", caps.limits.max_steps);
  },
  video(root, caps) {
    fillSelect($(root, '[name="size"]'), ["", ...sizesWithin(caps.limits)], ["(model default)", ...sizesWithin(caps.limits)]);
    setMax(root, "num_inference_steps", caps.limits.max_steps);
    setMax(root, "num_frames", caps.limits.max_frames);
  },
  live() {},
};

async function loadModels() {
  const status = document.getElementById("models-status");
  const keyField = $(document, '.field[data-param="api_key"]');
  clearErrors(keyField);
  let listing;
  try {
    listing = await (await api("/v1/models")).json();
  } catch (error) {
    $(keyField, ".error").textContent = error.message;
    status.textContent = "No models loaded.";
    return;
  }
  models.clear();
  for (const model of listing.data) models.set(model.id, model);
  status.textContent = `Serving ${listing.data.length} model(s): ${listing.data.map((m) => m.id).join(", ")}`;
  let first = null;
  for (const [name, offered] of Object.entries(OFFERS)) {
    const names = listing.data.filter((m) => offered(capabilitiesOf(m))).map((m) => m.id);
    $(document, `#tabs button[data-panel="${name}"]`).hidden = names.length === 0;
    const root = panel(name);
    const select = $(root, 'select[name="model"]');
    fillSelect(select, names);
    if (names.length) {
      first = first || name;
      await modelChanged(name);
    }
  }
  showPanel(first);
  status.dataset.state = "ready";
}

async function modelChanged(name) {
  const root = panel(name);
  clearErrors(root);
  const { name: model, caps } = selectedModel(root);
  try {
    await onModelChange[name](root, caps, model);
  } catch (error) {
    showError(root, "", error);
  }
}

function showPanel(name) {
  for (const button of document.querySelectorAll("#tabs button")) {
    button.classList.toggle("active", button.dataset.panel === name);
  }
  for (const section of document.querySelectorAll(".panel")) section.hidden = section.id !== `panel-${name}`;
}

// ---- chat ------------------------------------------------------------------------------------------

function initChat(root) {
  let history = [];
  const log = $(root, ".log");
  $(root, 'button[name="clear"]').addEventListener("click", () => {
    history = [];
    log.replaceChildren();
  });
  action(root, "send", async () => {
    const { name, caps } = selectedModel(root);
    const text = $(root, '[name="message"]').value;
    const system = $(root, '[name="system"]').value.trim();
    const speak = caps.modalities.includes("audio") && $(root, '[name="speak"]').checked;
    const draw = caps.modalities.includes("image") && $(root, '[name="draw"]').checked;
    const messages = [...(system ? [{ role: "system", content: system }] : []), ...history, { role: "user", content: text }];
    const modalities = draw ? ["image"] : speak ? ["text", "audio"] : ["text"];
    const body = { model: name, messages, stream: true, modalities };
    const temperature = numberField(root, "temperature");
    const maxTokens = numberField(root, "max_tokens");
    if (temperature !== undefined) body.temperature = temperature;
    if (maxTokens !== undefined) body.max_tokens = maxTokens;
    const player = speak ? new StreamPlayer() : null;
    const user = document.createElement("li");
    user.className = "msg user";
    user.textContent = text;
    const answer = document.createElement("li");
    answer.className = "msg assistant";
    answer.dataset.state = "streaming";
    const answerText = document.createElement("p");
    answer.append(answerText);
    log.append(user, answer);
    let reply = "";
    const steps = draw ? document.createElement("progress") : null;
    if (steps) answer.append(steps);
    try {
      const response = await api("/v1/chat/completions", { method: "POST", json: body });
      for await (const chunk of sseData(response)) {
        if (steps && chunk.progress) {
          steps.max = chunk.progress.total;
          steps.value = chunk.progress.step;
        }
        const delta = (chunk.choices[0] || {}).delta || {};
        if (!delta.content) continue;
        if (chunk.modality === "image" && draw) {
          const picture = document.createElement("img");
          picture.src = delta.content;
          picture.alt = text;
          answer.append(picture);
        } else if (chunk.modality === "audio" && player) {
          const wav = parseWav(base64Bytes(delta.content));
          player.push(wav.pcm, wav.rate);
        } else if (chunk.modality === "text" || chunk.modality === undefined) {
          reply += delta.content;
          answerText.textContent = reply;
        }
      }
    } catch (error) {
      answer.dataset.state = "failed";
      throw error;
    }
    if (player && player.chunks) {
      answer.append(audioElement(player.blob(), "answer.wav"));
      answer.dataset.audioChunks = String(player.chunks);
    }
    if (!draw) history = [...history, { role: "user", content: text }, { role: "assistant", content: reply }];
    $(root, '[name="message"]').value = "";
    answer.dataset.state = "done";
  });
}

// ---- speech ----------------------------------------------------------------------------------------

function initSpeech(root) {
  const result = $(root, ".result");
  action(root, "speak", async () => {
    const { name } = selectedModel(root);
    const format = $(root, '[name="response_format"]').value;
    const body = { model: name, input: $(root, '[name="input"]').value, response_format: format };
    const voice = $(root, '[name="voice"]').value;
    if (voice) body.voice = voice;
    const speed = numberField(root, "speed");
    const seed = numberField(root, "seed");
    if (speed !== undefined && speed !== 1) body.speed = speed;
    if (seed !== undefined) body.seed = seed;
    result.replaceChildren();
    result.dataset.state = "running";
    if ($(root, '[name="stream"]').checked) {
      body.stream_format = "sse";
      const player = new StreamPlayer();
      const response = await api("/v1/audio/speech", { method: "POST", json: body });
      for await (const event of sseData(response)) {
        if (event.type !== "speech.audio.delta") continue;
        const bytes = base64Bytes(event.audio);
        player.push(event.response_format === "pcm" ? bytes : parseWav(bytes).pcm, event.sample_rate);
      }
      result.append(audioElement(player.blob(), "speech.wav"));
    } else {
      const response = await api("/v1/audio/speech", { method: "POST", json: body });
      let blob = await response.blob();
      const rate = Number(response.headers.get("x-omnistage-sample-rate"));
      const playable = format === "pcm" ? wavBlob([new Uint8Array(await blob.arrayBuffer())], rate) : blob;
      const wrap = audioElement(playable, `speech.${format}`);
      if (format === "pcm") $(wrap, "a").href = URL.createObjectURL(blob);
      result.append(wrap);
      $(wrap, "audio").play().catch(() => {});
    }
    result.dataset.state = "done";
  });
}

// ---- images ----------------------------------------------------------------------------------------

function imageFields(root, name) {
  const fields = { model: name, prompt: $(root, '[name="prompt"]').value };
  const size = $(root, '[name="size"]').value;
  if (size) fields.size = size;
  for (const key of ["num_inference_steps", "seed"]) {
    const value = numberField(root, key);
    if (value !== undefined) fields[key] = value;
  }
  return fields;
}

function addToGallery(root, listing, fields, label) {
  const gallery = $(root, ".gallery");
  for (const item of listing.data) {
    const figure = document.createElement("figure");
    const img = document.createElement("img");
    img.src = `data:image/${listing.output_format || "png"};base64,${item.b64_json}`;
    img.alt = fields.prompt;
    const caption = document.createElement("figcaption");
    caption.textContent = `${label} · ${listing.size}${fields.seed !== undefined ? ` · seed ${fields.seed}` : ""}`;
    figure.append(img, caption);
    gallery.prepend(figure);
  }
}

function initImages(root) {
  action(root, "generate", async () => {
    const fields = imageFields(root, selectedModel(root).name);
    const response = await api("/v1/images/generations", { method: "POST", json: fields });
    addToGallery(root, await response.json(), fields, "generated");
  });
  action(root, "edit", async () => {
    const file = $(root, '[name="image"]').files[0];
    if (!file) throw new ApiError("choose a picture to edit first", "image");
    const fields = imageFields(root, selectedModel(root).name);
    const form = new FormData();
    for (const [key, value] of Object.entries(fields)) form.append(key, String(value));
    form.append("image", file, file.name);
    const response = await api("/v1/images/edits", { method: "POST", form });
    addToGallery(root, await response.json(), fields, "edited");
  });
}

// ---- video -----------------------------------------------------------------------------------------

const POLL_MS = 500;

function initVideo(root) {
  const progress = $(root, "progress");
  const status = $(root, ".job-status");
  const video = $(root, "video");
  action(root, "create", async () => {
    const fields = imageFields(root, selectedModel(root).name);
    const frames = numberField(root, "num_frames");
    if (frames !== undefined) fields.num_frames = frames;
    video.hidden = true;
    let job = await (await api("/v1/videos", { method: "POST", json: fields })).json();
    while (job.status === "queued" || job.status === "in_progress") {
      progress.value = job.progress;
      status.textContent = `${job.id}: ${job.status.replace("_", " ")} ${job.progress}%`;
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
      job = await (await api(`/v1/videos/${job.id}`)).json();
    }
    progress.value = job.progress;
    status.dataset.status = job.status;
    if (job.status !== "completed") {
      status.textContent = `${job.id}: ${job.status}`;
      throw new ApiError(job.error ? job.error.message : `the job ended ${job.status}`);
    }
    status.textContent = `${job.id}: completed (${job.size}, ${job.seconds} s)`;
    const clip = await (await api(`/v1/videos/${job.id}/content`)).blob();
    video.src = URL.createObjectURL(clip);
    video.hidden = false;
    video.play().catch(() => {});
  });
}

// ---- live voice: WS /v1/realtime -------------------------------------------------------------------

const LIVE_RATE = 24000; // the realtime API's pcm16 rate, both ways
const MIC_CHUNK = 2048; // samples a microphone chunk holds (about 85 ms)
const KEY_PROTOCOL = "openai-insecure-api-key."; // a browser cannot set headers on a WebSocket

function pcm16Base64(floats) {
  const bytes = new Uint8Array(floats.length * 2);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < floats.length; i++) {
    const x = Math.max(-1, Math.min(1, floats[i]));
    view.setInt16(2 * i, Math.round(x < 0 ? x * 32768 : x * 32767), true);
  }
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

/** Why the socket closed before a session opened. A missing or wrong key is refused on the handshake,
 * which a browser reports only as 1006 (abnormal closure); an accepted socket closed 1008 is a policy refusal. */
function closedBeforeSession(event) {
  if (event.code === 1006 || event.code === 1008) {
    return new ApiError(`the server refused the session (${event.code}): check the API key`, "api_key");
  }
  return new ApiError(`the server closed the connection (${event.code}${event.reason ? `: ${event.reason}` : ""})`);
}

/** One realtime session: the microphone in, server VAD turns, transcripts and the spoken answer out. */
class LiveSession {
  constructor(root, model) {
    this.root = root;
    this.model = model;
    this.log = $(root, ".log");
    this.status = $(root, ".live-status");
    this.users = new Map(); // item id → its <li>
    this.answers = new Map(); // response id → {li, text, player}
    this.player = null; // the answer now playing
    this.responding = false;
    this.closing = false;
  }

  /** Resolves once the session is configured and the microphone streams into it. */
  async open(session) {
    const key = sessionStorage.getItem(KEY_STORAGE);
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}/v1/realtime?model=${encodeURIComponent(this.model)}`;
    this.ws = new WebSocket(url, ["realtime", ...(key ? [KEY_PROTOCOL + key] : [])]);
    await new Promise((resolve, reject) => {
      this.ws.onmessage = (message) => {
        const event = JSON.parse(message.data);
        if (event.type === "session.created") resolve();
        else if (event.type === "error") reject(new ApiError(event.error.message, event.error.param));
      };
      this.ws.onclose = (event) => reject(closedBeforeSession(event));
    });
    this.ws.onmessage = (message) => this.handle(JSON.parse(message.data));
    this.ws.onclose = (event) => this.closed(event);
    this.send({ type: "session.update", session });
    await this.startMicrophone();
    this.setStatus("listening", "listening: speak, then pause");
  }

  async startMicrophone() {
    const constraints = { channelCount: 1, echoCancellation: true, noiseSuppression: false, autoGainControl: false };
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: constraints });
    this.mic = new AudioContext({ sampleRate: LIVE_RATE }); // the browser resamples the microphone to 24 kHz
    const source = this.mic.createMediaStreamSource(this.stream);
    const processor = this.mic.createScriptProcessor(MIC_CHUNK, 1, 1);
    processor.onaudioprocess = (e) => {
      const audio = pcm16Base64(e.inputBuffer.getChannelData(0));
      this.send({ type: "input_audio_buffer.append", audio });
      this.root.dataset.samplesSent = String(Number(this.root.dataset.samplesSent || 0) + MIC_CHUNK);
    };
    source.connect(processor);
    processor.connect(this.mic.destination); // a ScriptProcessor runs only while connected
  }

  send(event) {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(event));
  }

  setStatus(state, text) {
    this.status.dataset.state = state;
    this.status.textContent = text;
  }

  message(role, itemId) {
    const li = document.createElement("li");
    li.className = `msg ${role}`;
    li.dataset.item = itemId || "";
    li.dataset.state = "streaming";
    const text = document.createElement("p");
    li.append(text);
    this.log.append(li);
    return li;
  }

  handle(event) {
    const type = event.type;
    if (type === "input_audio_buffer.speech_started") {
      // Barge-in: the user speaks over the answer, so it stops at once (the server cancels it too).
      if (this.player && this.player.stop()) this.root.dataset.bargeIns = String(Number(this.root.dataset.bargeIns || 0) + 1);
      this.users.set(event.item_id, this.message("user", event.item_id));
      this.setStatus("hearing", "hearing you…");
    } else if (type === "input_audio_buffer.speech_stopped") {
      this.setStatus("thinking", "thinking…");
    } else if (type === "conversation.item.input_audio_transcription.completed") {
      const li = this.users.get(event.item_id) || this.message("user", event.item_id);
      $(li, "p").textContent = event.transcript;
      li.dataset.state = "done";
    } else if (type === "conversation.item.input_audio_transcription.failed") {
      const li = this.users.get(event.item_id);
      if (li) li.dataset.state = "failed";
      this.showError(new ApiError(event.error.message, event.error.param));
    } else if (type === "response.created") {
      this.responding = true;
      const li = this.message("assistant", event.response.id);
      this.player = new StreamPlayer((samples) => this.played(samples));
      this.answers.set(event.response.id, { li, text: "", player: this.player });
      this.setStatus("answering", "answering…");
    } else if (type === "response.output_audio_transcript.delta" || type === "response.output_text.delta") {
      const answer = this.answers.get(event.response_id);
      if (!answer) return;
      answer.text += event.delta;
      $(answer.li, "p").textContent = answer.text;
    } else if (type === "response.output_audio.delta") {
      const answer = this.answers.get(event.response_id);
      if (answer) answer.player.push(base64Bytes(event.delta), LIVE_RATE);
    } else if (type === "response.done") {
      this.responding = false;
      const { status, status_details: details } = event.response;
      const answer = this.answers.get(event.response.id);
      if (answer) answer.li.dataset.state = status;
      if (status === "failed" && details && details.error) this.showError(new ApiError(details.error.message));
      this.setStatus("listening", "listening: speak, then pause");
    } else if (type === "error") {
      this.showError(new ApiError(event.error.message, event.error.param));
    }
  }

  played(samples) {
    this.root.dataset.samplesPlayed = String(Number(this.root.dataset.samplesPlayed || 0) + samples);
  }

  showError(error) {
    showError(this.root, "start", error);
  }

  /** The stop button: cancels the answer being made, silences it, and closes the session. */
  stop() {
    this.closing = true;
    if (this.responding) this.send({ type: "response.cancel" });
    if (this.player) this.player.stop();
    this.ws.close(1000);
    this.release();
  }

  release() {
    if (this.stream) for (const track of this.stream.getTracks()) track.stop();
    if (this.mic) this.mic.close();
    this.stream = this.mic = null;
  }

  closed(event) {
    this.release();
    if (this.player) this.player.stop();
    this.setStatus("closed", `closed (${event.code})`);
    if (!this.closing && event.code !== 1000) this.showError(closedBeforeSession(event));
    this.root.dispatchEvent(new Event("live-closed"));
  }
}

function liveSessionConfig(root) {
  const session = { type: "realtime", output_modalities: ["audio"], audio: { input: { turn_detection: { type: "server_vad" } } } };
  const temperature = numberField(root, "temperature");
  const maxTokens = numberField(root, "max_output_tokens");
  const instructions = $(root, '[name="instructions"]').value.trim();
  if (temperature !== undefined) session.temperature = temperature;
  if (maxTokens !== undefined) session.max_output_tokens = maxTokens;
  if (instructions) session.instructions = instructions;
  return session;
}

function initLive(root) {
  const start = $(root, 'button[name="start"]');
  const stop = $(root, 'button[name="stop"]');
  let live = null;
  const idle = () => {
    live = null;
    start.disabled = false;
    stop.disabled = true;
  };
  root.addEventListener("live-closed", idle);
  start.addEventListener("click", async () => {
    clearErrors(root);
    start.disabled = true;
    const session = new LiveSession(root, selectedModel(root).name);
    try {
      await session.open(liveSessionConfig(root));
      live = session;
      stop.disabled = false;
    } catch (error) {
      if (session.ws) session.stop();
      session.setStatus("closed", "not connected");
      showError(root, "start", error);
      start.disabled = false;
    }
  });
  stop.addEventListener("click", () => {
    if (live) live.stop();
    idle();
  });
}

// ---- start -----------------------------------------------------------------------------------------

function start() {
  const key = document.getElementById("api-key");
  key.value = sessionStorage.getItem(KEY_STORAGE) || "";
  key.addEventListener("change", () => {
    if (key.value) sessionStorage.setItem(KEY_STORAGE, key.value);
    else sessionStorage.removeItem(KEY_STORAGE);
    loadModels();
  });
  for (const button of document.querySelectorAll("#tabs button")) {
    button.addEventListener("click", () => showPanel(button.dataset.panel));
  }
  for (const name of Object.keys(OFFERS)) {
    $(panel(name), 'select[name="model"]').addEventListener("change", () => modelChanged(name));
  }
  initChat(panel("chat"));
  initSpeech(panel("speech"));
  initImages(panel("images"));
  initVideo(panel("video"));
  initLive(panel("live"));
  loadModels();
}

start();
