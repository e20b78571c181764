// The playground: builds a Chat Completions or Responses request, sends it through
// /console/playground/send (the server adds the signed-in key), and draws the answer as it
// streams: reasoning apart from the answer, tool calls and web-search sources as such.
"use strict";

const form = document.getElementById("play-form");
const models = JSON.parse(document.getElementById("models-data").textContent);
const $ = (id) => document.getElementById(id);
const SEARCH_ROUNDS = 3; // chat: $web_search calls answered before giving up
let controller = null;

function fillEfforts() {
  const efforts = models[$("model").value] || [];
  $("effort").innerHTML = "";
  for (const e of efforts) $("effort").add(new Option(e, e));
}
$("model").addEventListener("change", fillEfforts);
fillEfforts();

function endpoint() { return form.elements.endpoint.value; }

function userTools() {
  const text = $("tools").value.trim();
  if (!text) return [];
  const tools = JSON.parse(text); // a SyntaxError is shown as the request's error
  return Array.isArray(tools) ? tools : [tools];
}

function buildBody() {
  const stream = $("stream").checked;
  const search = $("web-search").checked;
  const max = parseInt($("max-tokens").value, 10) || undefined;
  const system = $("system").value.trim();
  const tools = userTools();
  if (endpoint() === "chat") {
    const messages = [];
    if (system) messages.push({ role: "system", content: system });
    messages.push({ role: "user", content: $("message").value });
    const body = { model: $("model").value, messages, reasoning_effort: $("effort").value || undefined,
                   max_completion_tokens: max, stream };
    if (stream) body.stream_options = { include_usage: true };
    if (search) tools.push({ type: "builtin_function", function: { name: "$web_search" } });
    if (tools.length) body.tools = tools;
    return body;
  }
  const body = { model: $("model").value, input: $("message").value, max_output_tokens: max, stream };
  if (system) body.instructions = system;
  if ($("effort").value) body.reasoning = { effort: $("effort").value };
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

function reset() {
  for (const id of ["reasoning", "answer", "tool-calls", "sources", "usage", "reasoning-state"]) $(id).textContent = "";
  $("error").hidden = true;
  $("tool-calls-box").hidden = true;
  $("sources-box").hidden = true;
}

function showError(message) { $("error").textContent = message; $("error").hidden = false; }

function addToolCall(name, args, kind) {
  const li = document.createElement("li");
  li.className = "tool-call " + (kind || "function");
  const title = document.createElement("strong");
  title.textContent = name;
  const pre = document.createElement("pre");
  pre.className = "mono";
  pre.textContent = args;
  li.append(title, pre);
  $("tool-calls").append(li);
  $("tool-calls-box").hidden = false;
}

function addSource(text, url) {
  const li = document.createElement("li");
  if (url && /^https?:\/\//i.test(url)) { // only web links are links (a local index names files)
    const a = document.createElement("a");
    a.href = url; a.textContent = url; a.rel = "noreferrer noopener"; a.target = "_blank";
    li.append(a);
  } else {
    li.textContent = text;
  }
  $("sources").append(li);
  $("sources-box").hidden = false;
}

function showUsage(u) {
  if (!u) return;
  const d = u.completion_tokens_details || u.output_tokens_details || {};
  const prompt = u.prompt_tokens ?? u.input_tokens, out = u.completion_tokens ?? u.output_tokens;
  $("usage").textContent = `prompt ${prompt} tokens, output ${out} (reasoning ${d.reasoning_tokens ?? 0})`;
}

async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data && data !== "[DONE]") yield JSON.parse(data);
    }
  }
}

// -- Chat Completions ------------------------------------------------------------------------

function chatMessage(stream) { return { reasoning: "", content: "", calls: [], finish: null, stream }; }

function chatDelta(state, delta) {
  if (delta.reasoning_content) { state.reasoning += delta.reasoning_content; $("reasoning").textContent += delta.reasoning_content; }
  if (delta.content) { state.content += delta.content; $("answer").textContent += delta.content; }
  for (const call of delta.tool_calls || []) {
    const slot = state.calls[call.index ?? 0] ??= { id: "", type: call.type || "function", function: { name: "", arguments: "" } };
    if (call.id) slot.id = call.id;
    if (call.type) slot.type = call.type;
    if (call.function?.name) slot.function.name += call.function.name;
    if (call.function?.arguments) slot.function.arguments += call.function.arguments;
  }
}

async function chatRound(body) {
  const response = await send(body);
  if ($("reasoning").textContent) $("reasoning").textContent += "\n\n"; // a new round after a search
  const state = chatMessage(body.stream);
  if (body.stream) {
    for await (const event of sseEvents(response)) {
      if (event.error) throw new Error(event.error.message);
      if (event.usage) showUsage(event.usage);
      const choice = (event.choices || [])[0];
      if (!choice) continue;
      if ($("reasoning").textContent && choice.delta?.content) $("reasoning-state").textContent = "(done)";
      chatDelta(state, choice.delta || {});
      if (choice.finish_reason) state.finish = choice.finish_reason;
    }
  } else {
    const json = await response.json();
    const choice = json.choices[0];
    chatDelta(state, { reasoning_content: choice.message.reasoning_content, content: choice.message.content,
                       tool_calls: (choice.message.tool_calls || []).map((c, index) => ({ ...c, index })) });
    state.finish = choice.finish_reason;
    showUsage(json.usage);
  }
  return state;
}

async function runChat(body) {
  for (let round = 0; round <= SEARCH_ROUNDS; round++) {
    const state = await chatRound(body);
    const searches = state.calls.filter((c) => c.function.name === "$web_search");
    for (const c of state.calls) {
      if (c.function.name === "$web_search") addSource(`searched: ${searchQuery(c.function.arguments)}`);
      else addToolCall(c.function.name, c.function.arguments, c.type);
    }
    // Kimi's contract: the client sends each $web_search call back as a tool message and the
    // server runs the search; any other tool call is the client's to answer.
    if (state.finish !== "tool_calls" || searches.length === 0 || searches.length !== state.calls.length) return;
    body.messages.push({ role: "assistant", content: state.content || "", reasoning_content: state.reasoning || undefined,
                         tool_calls: state.calls });
    for (const c of searches) body.messages.push({ role: "tool", tool_call_id: c.id, name: "$web_search", content: c.function.arguments });
  }
}

function searchQuery(args) {
  try { return JSON.parse(args).query ?? args; } catch { return args; }
}

// -- Responses -------------------------------------------------------------------------------

function responsesItem(item) {
  if (item.type === "function_call") addToolCall(item.name, item.arguments, "function");
  else if (item.type === "custom_tool_call") addToolCall(item.name, item.input, "custom");
  else if (item.type === "web_search_call") {
    const action = item.action || {};
    if (action.query) addSource(`searched: ${action.query}`);
    for (const s of action.sources || []) addSource(s.url, s.url);
  }
}

async function runResponses(body) {
  const response = await send(body);
  if (!body.stream) {
    const json = await response.json();
    for (const item of json.output || []) {
      if (item.type === "reasoning") $("reasoning").textContent += (item.summary || []).map((s) => s.text).join("\n");
      else if (item.type === "message") $("answer").textContent += item.content.map((p) => p.text || "").join("");
      else responsesItem(item);
    }
    showUsage(json.usage);
    return;
  }
  for await (const event of sseEvents(response)) {
    if (event.type === "response.reasoning_summary_text.delta") $("reasoning").textContent += event.delta;
    else if (event.type === "response.output_text.delta") { $("reasoning-state").textContent = "(done)"; $("answer").textContent += event.delta; }
    else if (event.type === "response.output_item.done") responsesItem(event.item);
    else if (event.type === "response.completed") showUsage(event.response.usage);
    else if (event.type === "response.failed") throw new Error(event.response?.error?.message || "The response failed.");
    else if (event.type === "error") throw new Error(event.message || event.error?.message || "The stream failed.");
  }
}

// -- sending ---------------------------------------------------------------------------------

async function send(body) {
  const payload = { endpoint: endpoint(), body };
  if ($("api-key")) payload.key = $("api-key").value;
  const response = await fetch("/console/playground/send", {
    method: "POST", signal: controller.signal, credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": form.dataset.csrf },
    body: JSON.stringify(payload),
  });
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    try { message += ": " + (await response.json()).error.message; } catch { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  reset();
  let body;
  try { body = buildBody(); } catch (e) { showError("Tools: " + e.message); return; }
  $("curl").textContent = curlOf(body);
  controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  $("output").dataset.state = "running";
  try {
    if (endpoint() === "chat") await runChat(body); else await runResponses(body);
    $("output").dataset.state = "done";
  } catch (e) {
    if (e.name !== "AbortError") showError(e.message);
    $("output").dataset.state = "failed";
  } finally {
    $("send").disabled = false; $("stop").disabled = true;
  }
});

$("stop").addEventListener("click", () => controller && controller.abort());
$("curl").textContent = curlOf(buildBody());
