// Starts the vendored Swagger UI on /docs (no inline script: the page's CSP is script-src 'self').
// The OpenAPI URL comes from the page's data-openapi-url attribute; presets and layout: Swagger UI's defaults.
window.addEventListener("DOMContentLoaded", function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.getAttribute("data-openapi-url") || "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
  });
});
