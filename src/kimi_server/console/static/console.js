// The console's page behaviour lives in files, never inline: the Content-Security-Policy
// (console/headers.py) runs no inline script or handler.

// Forms that ask first: <form data-confirm="question"> is sent only if the person agrees.
document.addEventListener("submit", (event) => {
  const form = event.target.closest("form[data-confirm]");
  if (form && !window.confirm(form.dataset.confirm)) event.preventDefault();
});

// Copy buttons: <button data-copy="#selector"> copies that element's value or text.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  if (!source) return;
  const text = "value" in source && source.value !== undefined ? source.value : source.textContent;
  const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1500); };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, () => fallback(source, done));
  } else {
    fallback(source, done);
  }
});

function fallback(source, done) {
  // Plain http (not a secure context): select the text and use the old copy command.
  if (source.select) { source.select(); } else {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  document.execCommand("copy");
  done();
}
