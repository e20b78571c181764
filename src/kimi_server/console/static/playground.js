// The playground: a conversation with a model through /console/playground/send (the server
// adds the signed-in key). Every turn is kept and sent again with the next message, on either
// endpoint; answers stream in as the server sends them, drawn as markdown (markdown.js: DOM
// calls only, no markup from the model), with the reasoning apart, and say why they stopped.
// A turn can be edited, an answer regenerated, an image attached, the whole exported as JSON.
// A document (PDF, Word, HTML, text) is read by the Files API as the sending key, through
// /console/playground/files, and its text goes as a system message before the conversation.
import { StreamError, chatMessages, responsesInput, runChat, runResponses } from "./playground_api.js";
import {
  addSource, addToolCall, drawAnswer, drawAssistant, drawUser, el, replay, showError, showRefusal, showStop, showUsage,
} from "./playground_turns.js";

const form = document.getElementById("play-form");
const models = JSON.parse(document.getElementById("models-data").textContent);
const $ = (id) => document.getElementById(id);
const MAX_IMAGE_BYTES = 2 * 1024 * 1024; // the playground's own request stays under its 4 MB bound

const state = { turns: [], running: null, editing: null, image: null, documents: [], attaching: false };

// -- settings --------------------------------------------------------------------------------

function fillEfforts() {
  const efforts = models[$("model").value] || [];
  $("effort").replaceChildren(...efforts.map((e) => new Option(e, e)));
}
$("model").addEventListener("change", fillEfforts);
fillEfforts();

function endpoint() { return form.elements.endpoint.value; }
function maxTokens() { return parseInt($("max-tokens").value, 10) || undefined; }

function userTools() {
  const text = $("tools").value.trim();
  if (!text) return [];
  const tools = JSON.parse(text); // a SyntaxError is shown as the request's error
  return Array.isArray(tools) ? tools : [tools];
}

function buildBody(turns) {
  const stream = $("stream").checked;
  const search = $("web-search").checked;
  const system = $("system").value.trim();
  const tools = userTools();
  const model = $("model").value, effort = $("effort").value || undefined;
  if (endpoint() === "chat") {
    const body = { model, messages: chatMessages(system, turns, state.documents), reasoning_effort: effort, max_completion_tokens: maxTokens(), stream };
    if (stream) body.stream_options = { include_usage: true };
    if (search) tools.push({ type: "builtin_function", function: { name: "$web_search" } });
    if (tools.length) body.tools = tools;
    return body;
  }
  const body = { model, input: responsesInput(turns, state.documents), max_output_tokens: maxTokens(), stream };
  if (system) body.instructions = system;
  if (effort) body.reasoning = { effort };
  const wire = tools.map((t) => (t.function ? { type: "function", ...t.function } : t));
  if (search) { wire.push({ type: "web_search" }); body.include = ["web_search_call.action.sources"]; }
  if (wire.length) body.tools = wire;
  return body;
}

function curlOf(body) {
  const path = endpoint() === "chat" ? "/v1/chat/completions" : "/v1/responses";
  const json = JSON.stringify(body, null, 2).replace(/'/g, "'\\''");
  return `curl ${form.dataset.origin}${path} \\\n  -H "Authorization: Bearer $KIMI_API_KEY" \\\n` +
         `  -H "Content-Type: application/json" \\\n  -d '${json}'`;
}

// -- drawing the turns -----------------------------------------------------------------------

function redraw() {
  const nodes = [];
  state.turns.forEach((turn, index) => {
    if (turn.role === "user") { nodes.push(drawUser(turn, index, startEdit)); return; }
    const node = drawAssistant(turn, regenerateLast);
    turn.node = node;
    replay(turn);
    nodes.push(node);
  });
  $("conversation").replaceChildren(...nodes);
  refreshControls();
}

// Send, Stop, Edit and Regenerate as the state allows.
function refreshControls() {
  const running = state.running !== null;
  const last = state.turns[state.turns.length - 1];
  for (const node of document.querySelectorAll("#conversation .turn")) {
    const regen = node.querySelector(".regenerate");
    if (regen) regen.hidden = running || node !== last?.node;
    const edit = node.querySelector(".edit");
    if (edit) edit.disabled = running;
  }
  $("send").disabled = running || state.attaching;
  $("stop").disabled = !running;
  $("export").disabled = state.turns.length === 0;
  $("new-chat").disabled = running || state.turns.length === 0;
  $("empty-note").hidden = state.turns.length > 0;
}

// Answer text is drawn again as markdown once per frame while it streams.
function scheduleAnswer(turn) {
  if (turn.frame) return;
  turn.frame = requestAnimationFrame(() => {
    turn.frame = 0;
    drawAnswer(turn);
  });
}

// -- running a turn --------------------------------------------------------------------------

async function send(body) {
  const payload = { endpoint: endpoint(), body };
  if ($("api-key")) payload.key = $("api-key").value;
  const response = await fetch("/console/playground/send", {
    method: "POST", signal: state.running.signal, credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": form.dataset.csrf },
    body: JSON.stringify(payload),
  });
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    try { message += ": " + (await response.json()).error.message; } catch { /* not JSON */ }
    throw new StreamError(message);
  }
  return response;
}

function sinkFor(turn) {
  const reasoning = () => turn.node.querySelector(".reasoning");
  return {
    reasoning(text) {
      if (!text) return;
      turn.reasoning += text;
      reasoning().textContent += text;
      turn.node.querySelector(".reasoning-box").hidden = false;
    },
    content(text) {
      if (!text) return;
      if (turn.reasoning) turn.node.querySelector(".reasoning-state").textContent = "(done)";
      turn.content += text;
      scheduleAnswer(turn);
    },
    refusal(text) { turn.refusal += text; showRefusal(turn); },
    toolCall(name, args, kind) { addToolCall(turn, name, args, kind); },
    source(text, url) { addSource(turn, text, url); },
    usage(u) { if (u) { turn.usage = u; showUsage(turn); } },
    items(items) { turn.items = items; },
    roundBreak() { if (turn.reasoning) this.reasoning("\n\n"); },
  };
}

async function runTurn() {
  let body;
  try { body = buildBody(state.turns); } catch (e) { composerError("Tools: " + e.message); return; }
  $("curl").textContent = curlOf(body);
  const turn = { role: "assistant", model: body.model, endpoint: endpoint(), reasoning: "", content: "", refusal: "",
                 calls: [], sources: [], usage: null, items: null, finish: null, detail: null, error: null,
                 state: "running", maxTokens: maxTokens(), frame: 0 };
  state.turns.push(turn);
  turn.node = drawAssistant(turn, regenerateLast);
  $("conversation").append(turn.node);
  state.running = new AbortController();
  $("output").dataset.state = "running";
  refreshControls();
  const sink = sinkFor(turn);
  try {
    const end = endpoint() === "chat" ? await runChat(send, body, sink) : await runResponses(send, body, sink);
    turn.finish = turn.refusal && (end.reason === "stop" || end.reason === "completed") ? "refusal" : end.reason;
    turn.detail = end.detail || null;
    turn.state = "done";
  } catch (e) {
    if (e.name === "AbortError") { turn.finish = "stopped"; turn.state = "stopped"; } else {
      turn.finish = "error"; turn.state = "failed"; turn.error = e.message; showError(turn, e.message);
    }
  } finally {
    state.running = null;
    if (turn.frame) { cancelAnimationFrame(turn.frame); turn.frame = 0; }
    drawAnswer(turn);
    showStop(turn);
    $("output").dataset.state = turn.state === "done" ? "done" : turn.state;
    refreshControls();
  }
}

// -- the composer: send, edit, attach --------------------------------------------------------

function composerError(message) {
  $("composer-error").textContent = message;
  $("composer-error").hidden = !message;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  if (state.running || state.attaching) return;
  const text = $("message").value;
  if (!text.trim() && !state.image) { composerError("Write a message first."); return; }
  composerError("");
  if (state.editing !== null) { state.turns = state.turns.slice(0, state.editing); endEdit(); redraw(); }
  const turn = { role: "user", text, image: state.image };
  state.turns.push(turn);
  $("conversation").append(drawUser(turn, state.turns.length - 1, startEdit));
  $("message").value = "";
  clearImage();
  await runTurn();
});

function regenerateLast() {
  if (state.running || state.turns[state.turns.length - 1]?.role !== "assistant") return;
  state.turns.pop();
  redraw();
  runTurn();
}

function startEdit(index) {
  if (state.running) return;
  const turn = state.turns[index];
  state.editing = index;
  $("message").value = turn.text;
  setImage(turn.image);
  $("editing-turn").textContent = String(state.turns.slice(0, index + 1).filter((t) => t.role === "user").length);
  $("editing-note").hidden = false;
  for (const node of document.querySelectorAll("#conversation .turn")) node.classList.toggle("editing", node.dataset.index === String(index));
  $("message").focus();
}

function endEdit() {
  state.editing = null;
  $("editing-note").hidden = true;
  for (const node of document.querySelectorAll("#conversation .turn.editing")) node.classList.remove("editing");
}

$("cancel-edit").addEventListener("click", () => { endEdit(); $("message").value = ""; clearImage(); });

function setImage(url) {
  state.image = url || null;
  $("image-thumb").src = url || "";
  $("image-preview").hidden = !url;
}

function clearImage() { setImage(null); $("image").value = ""; }

$("image").addEventListener("change", () => {
  const file = $("image").files[0];
  if (!file) return;
  if (file.size > MAX_IMAGE_BYTES) { composerError(`The image is larger than ${MAX_IMAGE_BYTES / 1048576} MB.`); clearImage(); return; }
  const reader = new FileReader();
  reader.onload = () => { composerError(""); setImage(reader.result); }; // a data: URL, sent as the message's image part
  reader.readAsDataURL(file);
});
$("image-remove").addEventListener("click", clearImage);

// A document stays attached to the conversation (every request carries it) until removed;
// removing it here leaves the file among the key's files (GET /v1/files).
function drawDocuments() {
  const items = state.documents.map((doc, index) => {
    const item = el("li", "document");
    item.dataset.fileId = doc.id;
    const remove = el("button", "link", "Remove");
    remove.type = "button";
    remove.addEventListener("click", () => { state.documents.splice(index, 1); drawDocuments(); });
    item.append(el("span", "document-name", doc.filename), " ",
                el("span", "muted document-size", `${doc.chars.toLocaleString("en")} characters of text`), " ", remove);
    if (doc.note) item.append(el("span", "muted document-note", " " + doc.note));
    return item;
  });
  $("documents").replaceChildren(...items);
  $("documents").hidden = items.length === 0;
}

function codePoints(text) {
  let count = 0;
  for (const _ of text) count++;
  return count;
}

async function attachDocument(file) {
  const data = new FormData();
  if ($("api-key")) data.append("key", $("api-key").value);
  data.append("file", file, file.name);
  state.attaching = true;
  $("document-status").textContent = `Reading ${file.name}…`;
  $("document-status").hidden = false;
  refreshControls();
  try {
    const response = await fetch("/console/playground/files", {
      method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": form.dataset.csrf }, body: data,
    });
    let answer = null;
    try { answer = await response.json(); } catch { /* not JSON */ }
    if (!response.ok) {
      composerError(`Could not attach ${file.name}: ${answer?.error?.message || `HTTP ${response.status}`}`);
      return;
    }
    composerError("");
    state.documents.push({
      id: answer.file.id, filename: answer.file.filename, bytes: answer.file.bytes, note: answer.file.status_details || "",
      chars: codePoints(answer.content.content), message: JSON.stringify(answer.content),
    });
    drawDocuments();
  } catch (e) {
    composerError(`Could not attach ${file.name}: ${e.message}`);
  } finally {
    state.attaching = false;
    $("document").value = "";
    $("document-status").hidden = true;
    refreshControls();
  }
}

$("document").addEventListener("change", () => {
  const file = $("document").files[0];
  if (file) attachDocument(file);
});

$("stop").addEventListener("click", () => state.running && state.running.abort());

$("new-chat").addEventListener("click", () => {
  if (state.running) return;
  state.turns = [];
  endEdit();
  redraw();
  $("output").dataset.state = "empty";
});

// -- export ----------------------------------------------------------------------------------

function exported() {
  const turns = state.turns.map((t) => (t.role === "user"
    ? { role: "user", content: t.text, ...(t.image ? { image: t.image } : {}) }
    : { role: "assistant", model: t.model, endpoint: t.endpoint, content: t.content, reasoning: t.reasoning || undefined,
        refusal: t.refusal || undefined, tool_calls: t.calls.length ? t.calls : undefined, finish: t.finish,
        error: t.error || undefined, usage: t.usage || undefined, output: t.items || undefined }));
  const system = $("system").value.trim();
  return {
    exported_at: new Date().toISOString(),
    endpoint: endpoint(),
    model: $("model").value,
    effort: $("effort").value || null,
    system: system || null,
    documents: state.documents.map((d) => ({ id: d.id, filename: d.filename, bytes: d.bytes, characters: d.chars })),
    turns,
    // The conversation as either endpoint takes it, to send on from your own code.
    messages: chatMessages(system, state.turns, state.documents),
    input: responsesInput(state.turns, state.documents),
  };
}

$("export").addEventListener("click", () => {
  const blob = new Blob([JSON.stringify(exported(), null, 2)], { type: "application/json" });
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = `conversation-${new Date().toISOString().slice(0, 19).replace(/[:T]/g, "-")}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
});

$("curl").textContent = curlOf(buildBody([{ role: "user", text: $("message").value }]));
refreshControls();
