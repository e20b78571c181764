// The API documentation page: Swagger UI on /openapi.json, with the API key.
// The document needs a key (unless the server sets public_docs), so the key typed here is kept
// in this tab only (sessionStorage), sent with every request the page makes, and put in
// Swagger's Authorize dialog for "Try it out".
(function () {
  "use strict";
  const STORE = "kimi-server-docs-key";
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  const note = document.getElementById("key-note");
  const documentUrl = document.getElementById("swagger-ui").dataset.openapi;

  function key() {
    return sessionStorage.getItem(STORE) || "";
  }

  function start() {
    const ui = SwaggerUIBundle({
      url: documentUrl,
      dom_id: "#swagger-ui",
      deepLinking: true,
      persistAuthorization: false,
      validatorUrl: null, // no badge from validator.swagger.io: nothing leaves this server
      requestInterceptor: function (request) {
        // the document itself, fetched with the typed key; "Try it out" uses Authorize's value.
        if (key() && request.url.endsWith(documentUrl)) {
          request.headers.Authorization = "Bearer " + key();
        }
        return request;
      },
      onComplete: function () {
        if (key()) {
          ui.preauthorizeApiKey("APIKey", key());
        }
      },
    });
    window.ui = ui;
  }

  fetch(documentUrl, { headers: key() ? { Authorization: "Bearer " + key() } : {} }).then(function (r) {
    if (r.ok) {
      form.hidden = true;
      start();
    } else {
      form.hidden = false;
      note.textContent = key() ? "That key was refused (" + r.status + ")." : "";
    }
  });

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    sessionStorage.setItem(STORE, input.value.trim());
    window.location.reload();
  });
})();
