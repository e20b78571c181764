// The playground's side of the two APIs: the conversation as each endpoint takes it (the
// server keeps no state: every request carries the turns before it), the answer read from a
// stream or a plain response, and why it stopped. What is read goes to a "sink" (the page).
"use strict";

const SEARCH_ROUNDS = 3; // chat: $web_search calls answered before giving up

// -- the conversation as each endpoint takes it ----------------------------------------------

function chatUser(turn) {
  if (!turn.image) return { role: "user", content: turn.text };
  return { role: "user", content: [{ type: "text", text: turn.text }, { type: "image_url", image_url: { url: turn.image } }] };
}

// Attached documents go as Kimi's long-document workflow puts them: each one's extracted text
// (the Files API's content answer, as JSON) in a system message of its own, after the system
// text and before the conversation.
export function chatMessages(system, turns, documents = []) {
  const messages = system ? [{ role: "system", content: system }] : [];
  for (const doc of documents) messages.push({ role: "system", content: doc.message });
  for (const turn of turns) {
    if (turn.role === "user") messages.push(chatUser(turn));
    else if (turn.content) messages.push({ role: "assistant", content: turn.content }); // a failed turn with no text is left out
  }
  return messages;
}

function responsesUser(turn) {
  const content = [{ type: "input_text", text: turn.text }];
  if (turn.image) content.push({ type: "input_image", image_url: turn.image });
  return { type: "message", role: "user", content };
}

// What an answer sent back must hold: its sealed reasoning and its message. Calls the page
// never answered are left out (the API wants each call's output with it).
const RESENT = new Set(["reasoning", "message"]);

export function responsesInput(turns, documents = []) {
  const input = documents.map((doc) => ({ type: "message", role: "system", content: [{ type: "input_text", text: doc.message }] }));
  for (const turn of turns) {
    if (turn.role === "user") { input.push(responsesUser(turn)); continue; }
    const items = (turn.items || []).filter((item) => RESENT.has(item.type));
    if (items.some((item) => item.type === "message")) input.push(...items);
    else if (turn.content) input.push({ type: "message", role: "assistant", content: [{ type: "output_text", text: turn.content }] });
  }
  return input;
}

// -- reading a stream ------------------------------------------------------------------------

export async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data && data !== "[DONE]") yield JSON.parse(data);
    }
  }
}

export class StreamError extends Error {}

// -- Chat Completions ------------------------------------------------------------------------

function chatDelta(state, delta, sink) {
  if (delta.reasoning_content) { state.reasoning += delta.reasoning_content; sink.reasoning(delta.reasoning_content); }
  if (delta.content) { state.content += delta.content; sink.content(delta.content); }
  if (delta.refusal) sink.refusal(delta.refusal);
  for (const call of delta.tool_calls || []) {
    const slot = state.calls[call.index ?? 0] ??= { id: "", type: call.type || "function", function: { name: "", arguments: "" } };
    if (call.id) slot.id = call.id;
    if (call.type) slot.type = call.type;
    if (call.function?.name) slot.function.name += call.function.name;
    if (call.function?.arguments) slot.function.arguments += call.function.arguments;
  }
}

async function chatRound(send, body, sink) {
  const response = await send(body);
  const state = { reasoning: "", content: "", calls: [], finish: null };
  if (!body.stream) {
    const json = await response.json();
    const choice = json.choices[0];
    chatDelta(state, { reasoning_content: choice.message.reasoning_content, content: choice.message.content,
                       refusal: choice.message.refusal,
                       tool_calls: (choice.message.tool_calls || []).map((c, index) => ({ ...c, index })) }, sink);
    state.finish = choice.finish_reason;
    sink.usage(json.usage);
    return state;
  }
  for await (const event of sseEvents(response)) {
    if (event.error) throw new StreamError(event.error.message || "The stream failed.");
    if (event.usage) sink.usage(event.usage);
    const choice = (event.choices || [])[0];
    if (!choice) continue;
    chatDelta(state, choice.delta || {}, sink);
    if (choice.finish_reason) state.finish = choice.finish_reason;
  }
  return state;
}

function searchQuery(args) {
  try { return JSON.parse(args).query ?? args; } catch { return args; }
}

// One chat turn, with the $web_search rounds the server answers; the finish reason of its end.
export async function runChat(send, body, sink) {
  for (let round = 0; round <= SEARCH_ROUNDS; round++) {
    if (round) sink.roundBreak();
    const state = await chatRound(send, body, sink);
    const searches = state.calls.filter((c) => c.function.name === "$web_search");
    for (const c of state.calls) {
      if (c.function.name === "$web_search") sink.source(`searched: ${searchQuery(c.function.arguments)}`);
      else sink.toolCall(c.function.name, c.function.arguments, c.type);
    }
    // Kimi's contract: the client sends each $web_search call back as a tool message and the
    // server runs the search; any other tool call is the client's to answer.
    if (state.finish !== "tool_calls" || searches.length === 0 || searches.length !== state.calls.length) {
      return { reason: state.finish || "ended" };
    }
    body.messages.push({ role: "assistant", content: state.content || "", reasoning_content: state.reasoning || undefined,
                         tool_calls: state.calls });
    for (const c of searches) body.messages.push({ role: "tool", tool_call_id: c.id, name: "$web_search", content: c.function.arguments });
  }
  return { reason: "tool_calls" };
}

// -- Responses -------------------------------------------------------------------------------

function responsesItem(item, sink) {
  if (item.type === "function_call") sink.toolCall(item.name, item.arguments, "function");
  else if (item.type === "custom_tool_call") sink.toolCall(item.name, item.input, "custom");
  else if (item.type === "web_search_call") {
    const action = item.action || {};
    if (action.query) sink.source(`searched: ${action.query}`);
    for (const s of action.sources || []) sink.source(s.url, s.url);
  }
}

function responseEnd(response, sink) {
  sink.usage(response.usage);
  sink.items(response.output || []);
  if (response.status === "incomplete") return { reason: "incomplete", detail: response.incomplete_details?.reason };
  return { reason: response.status || "completed" };
}

function plainResponse(json, sink) {
  for (const item of json.output || []) {
    if (item.type === "reasoning") sink.reasoning((item.summary || []).map((s) => s.text).join("\n"));
    else if (item.type === "message") {
      for (const part of item.content || []) {
        if (part.type === "refusal") sink.refusal(part.refusal); else sink.content(part.text || "");
      }
    } else responsesItem(item, sink);
  }
  if (json.status === "failed") throw new StreamError(json.error?.message || "The response failed.");
  return responseEnd(json, sink);
}

export async function runResponses(send, body, sink) {
  const response = await send(body);
  if (!body.stream) return plainResponse(await response.json(), sink);
  for await (const event of sseEvents(response)) {
    switch (event.type) {
      case "response.reasoning_summary_text.delta": sink.reasoning(event.delta); break;
      case "response.output_text.delta": sink.content(event.delta); break;
      case "response.refusal.delta": sink.refusal(event.delta); break;
      case "response.output_item.done": responsesItem(event.item, sink); break;
      case "response.completed":
      case "response.incomplete": return responseEnd(event.response, sink);
      case "response.failed": throw new StreamError(event.response?.error?.message || "The response failed.");
      case "error": throw new StreamError(event.message || event.error?.message || "The stream failed.");
      default: break;
    }
  }
  return { reason: "ended" }; // the stream stopped before the response did
}
