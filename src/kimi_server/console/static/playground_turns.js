// The playground's turns as the page draws them: a message of yours, an answer (its reasoning,
// its markdown, tool calls, sources, usage, and why it stopped). Elements only, with text set as
// text: nothing a model writes becomes markup (markdown.js draws the answers the same way).
import { renderMarkdown } from "./markdown.js";

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function drawUser(turn, index, onEdit) {
  const node = el("article", "turn user");
  node.dataset.index = index;
  node.append(el("div", "who", "You"), el("div", "text", turn.text));
  if (turn.image) {
    const img = el("img", "thumb");
    img.src = turn.image; // a data: URL the page made itself (the CSP allows data: images)
    img.alt = "the attached image";
    node.append(img);
  }
  const edit = el("button", "link edit", "Edit");
  edit.type = "button";
  edit.addEventListener("click", () => onEdit(index));
  node.append(el("div", "turn-actions"));
  node.lastChild.append(edit);
  return node;
}

export function drawAssistant(turn, onRegenerate) {
  const node = el("article", "turn assistant");
  node.dataset.state = turn.state;
  const reasoningBox = el("details", "reasoning-box");
  reasoningBox.open = true;
  const summary = el("summary", null, "Reasoning ");
  summary.append(el("span", "muted reasoning-state"));
  reasoningBox.append(summary, el("pre", "reasoning"));
  reasoningBox.hidden = !turn.reasoning;
  const calls = el("div", "tool-calls-box");
  calls.hidden = true;
  calls.append(el("h3", null, "Tool calls"), el("ol", "tool-calls"));
  const sources = el("div", "sources-box");
  sources.hidden = true;
  sources.append(el("h3", null, "Web search"), el("ul", "sources"));
  const stop = el("p", "stop-reason");
  stop.setAttribute("role", "status");
  stop.hidden = true;
  const error = el("p", "error");
  error.setAttribute("role", "alert");
  error.hidden = true;
  const actions = el("div", "turn-actions");
  const regenerate = el("button", "link regenerate", "Regenerate");
  regenerate.type = "button";
  regenerate.addEventListener("click", onRegenerate);
  actions.append(regenerate);
  node.append(el("div", "who", turn.model), reasoningBox, el("div", "answer markdown"), el("p", "refusal"), calls,
              sources, stop, error, el("p", "usage muted"), actions);
  node.querySelector(".refusal").hidden = true;
  return node;
}

// A kept turn drawn again (after an edit or a regenerate dropped others).
export function replay(turn) {
  const node = turn.node;
  node.querySelector(".reasoning").textContent = turn.reasoning;
  node.querySelector(".reasoning-box").hidden = !turn.reasoning;
  if (turn.reasoning && turn.content) node.querySelector(".reasoning-state").textContent = "(done)";
  node.querySelector(".answer").replaceChildren(renderMarkdown(turn.content));
  if (turn.refusal) showRefusal(turn);
  for (const c of turn.calls) addToolCall(turn, c.name, c.args, c.kind, false);
  for (const s of turn.sources) addSource(turn, s.text, s.url, false);
  showUsage(turn);
  if (turn.error) showError(turn, turn.error);
  showStop(turn);
}

export function addToolCall(turn, name, args, kind, keep = true) {
  if (keep) turn.calls.push({ name, args, kind });
  const li = el("li", "tool-call " + (kind || "function"));
  const pre = el("pre", "mono", args);
  li.append(el("strong", null, name), pre);
  turn.node.querySelector(".tool-calls").append(li);
  turn.node.querySelector(".tool-calls-box").hidden = false;
}

export function addSource(turn, text, url, keep = true) {
  if (keep) turn.sources.push({ text, url });
  const li = el("li");
  if (url && /^https?:\/\//i.test(url)) { // only web links are links (a local index names files)
    const a = el("a", null, url);
    a.href = url; a.rel = "noreferrer noopener"; a.target = "_blank";
    li.append(a);
  } else {
    li.textContent = text;
  }
  turn.node.querySelector(".sources").append(li);
  turn.node.querySelector(".sources-box").hidden = false;
}

export function showUsage(turn) {
  const u = turn.usage;
  if (!u) return;
  const d = u.completion_tokens_details || u.output_tokens_details || {};
  const prompt = u.prompt_tokens ?? u.input_tokens, out = u.completion_tokens ?? u.output_tokens;
  turn.node.querySelector(".usage").textContent = `prompt ${prompt} tokens, output ${out} (reasoning ${d.reasoning_tokens ?? 0})`;
}

export function showRefusal(turn) {
  const p = turn.node.querySelector(".refusal");
  p.textContent = "Refused: " + turn.refusal;
  p.hidden = false;
}

export function showError(turn, message) {
  const p = turn.node.querySelector(".error");
  p.textContent = message;
  p.hidden = false;
}

// Why the answer ended, in words, where it is not the plain end of an answer.
function stopWords(turn) {
  const empty = !turn.content.trim() && !turn.calls.length && !turn.refusal;
  const limit = turn.maxTokens ? ` (${turn.maxTokens} tokens)` : "";
  const spent = empty ? " before any answer: the reasoning took it all. Raise Output tokens and regenerate." : ".";
  switch (turn.finish) {
    case "length": return `Stopped: the answer reached the output limit${limit}${spent}`;
    case "incomplete":
      if (turn.detail === "content_filter") return "Incomplete: the answer was withheld by the content filter.";
      return `Incomplete: ${turn.detail === "max_output_tokens" || !turn.detail ? "the answer reached the output limit" + limit : turn.detail}${spent}`;
    case "content_filter": return "Stopped: the answer was withheld by the content filter.";
    case "refusal": return "The model refused to answer.";
    case "tool_calls": return "The model called a tool: the playground shows the call; your code would run it and send the result.";
    case "stopped": return "Stopped by you.";
    case "ended": return "The stream ended before the answer did.";
    case "error": return "Failed: the answer stopped with an error.";
    default: return empty ? "The model ended its turn without an answer." : "";
  }
}

export function showStop(turn) {
  const p = turn.node.querySelector(".stop-reason");
  const words = stopWords(turn);
  turn.node.dataset.finish = turn.finish || "";
  turn.node.dataset.state = turn.state;
  p.textContent = words;
  p.hidden = !words;
}

// The answer drawn again as markdown: at once, or once per frame while it streams.
export function drawAnswer(turn) {
  turn.node.querySelector(".answer").replaceChildren(renderMarkdown(turn.content));
}
