// Markdown for the playground's answers, drawn with DOM calls only: every piece of the text
// becomes a text node (textContent), never markup, so nothing a model writes (<script>, an
// <img onerror>, a javascript: link) can run or load. Links are kept for http(s) and mailto
// only, and open in a new tab without a referrer.
//
// What it draws: fenced code, headings, paragraphs with line breaks, lists (nested by
// indentation), block quotes, rules and pipe tables; inline code, bold, italics, strikethrough,
// links and bare web addresses. Anything else stays as the text it is.
"use strict";

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}>\s?/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const SAFE_LINK = /^(https?:\/\/|mailto:)/i;

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

// -- inline ----------------------------------------------------------------------------------

// Each rule: a pattern (sticky at the match's start), and how its match is drawn.
const INLINE = [
  { re: /(`+)([\s\S]*?[^`])\1(?!`)/, draw: (m) => { const c = el("code"); c.textContent = m[2].trim() || m[2]; return c; } },
  { re: /\[([^\]\n]+)\]\(\s*([^)\s]+)(?:\s+"[^"]*")?\s*\)/, draw: (m) => link(m[1], m[2]) },
  { re: /\bhttps?:\/\/[^\s<>]*[^\s<>.,;:!?)\]'"*_~]/, draw: (m) => link(m[0], m[0]) },
  { re: /\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__/, draw: (m) => wrap("strong", m[1] ?? m[2]) },
  { re: /~~(?=\S)([\s\S]*?\S)~~/, draw: (m) => wrap("del", m[1]) },
  { re: /\*(?=[^\s*])([^*]*?[^\s*])\*|(?<![\w])_(?=[^\s_])([^_]*?[^\s_])_(?![\w])/, draw: (m) => wrap("em", m[1] ?? m[2]) },
];

function wrap(tag, text) {
  const node = el(tag);
  inline(text, node);
  return node;
}

function link(text, href) {
  if (!SAFE_LINK.test(href)) { // any other scheme is shown as the text it is
    const span = el("span");
    inline(text === href ? text : `${text} (${href})`, span);
    return span;
  }
  const a = el("a");
  a.href = href;
  a.rel = "noreferrer noopener";
  a.target = "_blank";
  if (text === href) a.textContent = text; else inline(text, a);
  return a;
}

function inline(text, parent) {
  while (text) {
    let best = null;
    for (const rule of INLINE) {
      const m = rule.re.exec(text);
      if (m && (best === null || m.index < best.m.index)) best = { m, rule };
    }
    if (best === null) { parent.append(text); return; }
    if (best.m.index > 0) parent.append(text.slice(0, best.m.index));
    parent.append(best.rule.draw(best.m));
    text = text.slice(best.m.index + best.m[0].length);
  }
}

function inlineLines(text, parent) {
  text.split("\n").forEach((line, n) => {
    if (n) parent.append(el("br"));
    inline(line, parent);
  });
}

// -- blocks ----------------------------------------------------------------------------------

function cells(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
}

function table(lines, start) {
  const t = el("table");
  const head = el("thead");
  const tr = el("tr");
  for (const c of cells(lines[start])) { const th = el("th"); inline(c, th); tr.append(th); }
  head.append(tr);
  t.append(head);
  const body = el("tbody");
  let i = start + 2;
  for (; i < lines.length && lines[i].includes("|") && lines[i].trim(); i++) {
    const row = el("tr");
    for (const c of cells(lines[i])) { const td = el("td"); inline(c, td); row.append(td); }
    body.append(row);
  }
  t.append(body);
  const box = el("div", "md-table");
  box.append(t);
  return [box, i];
}

function fenced(lines, start, m) {
  const pre = el("pre");
  const code = el("code");
  if (m[2]) code.dataset.lang = m[2];
  const body = [];
  let i = start + 1;
  const close = new RegExp(`^ {0,3}${m[1][0]}{${m[1].length},}\\s*$`);
  for (; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
  code.textContent = body.join("\n");
  pre.append(code);
  return [pre, i + 1]; // an unclosed fence (still streaming) runs to the end
}

function list(lines, start) {
  const first = ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const node = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
  let i = start;
  let item = null;
  let body = [];
  const flush = () => { if (item) { fill(item, body); node.append(item); } };
  for (; i < lines.length; i++) {
    const line = lines[i];
    const m = ITEM.exec(line);
    if (m && m[1].length === indent && /\d/.test(m[2]) === ordered) {
      flush();
      item = el("li");
      body = [m[3]];
      continue;
    }
    const deeper = line.length - line.trimStart().length > indent;
    if (line.trim() === "" ? i + 1 < lines.length && indented(lines[i + 1], indent) : deeper) {
      body.push(line.slice(Math.min(indent + 2, line.length - line.trimStart().length)));
      continue;
    }
    if (line.trim() && !m && !startsBlock(line) && body.length && body[body.length - 1].trim()) {
      body.push(line.trim()); // a lazy continuation of the item's text
      continue;
    }
    break;
  }
  flush();
  return [node, i];
}

function indented(line, indent) {
  return line.trim() !== "" && line.length - line.trimStart().length > indent;
}

function fill(item, body) {
  const lines = body.join("\n").replace(/\n+$/, "").split("\n");
  if (lines.some((l) => !l.trim())) { item.append(blocks(lines.join("\n"))); return; } // a loose item
  // A tight item: its text with no paragraph, then what it holds (a nested list, say).
  const cut = lines.findIndex((l, n) => n > 0 && startsBlock(l));
  inlineLines((cut < 0 ? lines : lines.slice(0, cut)).join("\n"), item);
  if (cut > 0) item.append(blocks(lines.slice(cut).join("\n")));
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function blocks(text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) { i++; continue; }
    if ((m = FENCE.exec(line))) { const [node, next] = fenced(lines, i, m); out.append(node); i = next; continue; }
    if ((m = HEADING.exec(line))) { const h = el(`h${m[1].length + 2 > 6 ? 6 : m[1].length + 2}`); inline(m[2], h); out.append(h); i++; continue; }
    if (RULE.test(line)) { out.append(el("hr")); i++; continue; }
    if (QUOTE.test(line)) {
      const inner = [];
      for (; i < lines.length && lines[i].trim() && QUOTE.test(lines[i]); i++) inner.push(lines[i].replace(QUOTE, ""));
      const quote = el("blockquote");
      quote.append(blocks(inner.join("\n")));
      out.append(quote);
      continue;
    }
    if (ITEM.test(line)) { const [node, next] = list(lines, i); out.append(node); i = next; continue; }
    if (line.includes("|") && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      const [node, next] = table(lines, i);
      out.append(node);
      i = next;
      continue;
    }
    const para = [];
    for (; i < lines.length && lines[i].trim() && (para.length === 0 || !startsBlock(lines[i])); i++) para.push(lines[i]);
    const p = el("p");
    inlineLines(para.join("\n"), p);
    out.append(p);
  }
  return out;
}

// The text as a fragment of elements to put in the page.
export function renderMarkdown(text) {
  return blocks(String(text ?? ""));
}
