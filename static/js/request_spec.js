/* The request-spec editor (templates/dashboard/_request_spec.html) of the request and the
   new-schedule pages: header rows (add, remove, a secret header's value hidden as its name is
   typed) and, where the partial shows the JSON check (#format-body), the body checked as you
   type with its type following a Content-Type row. A page's own script calls
   SA.bindRequestSpec(form); app.js, loaded first, defines SA. */
(function () {
  "use strict";

  var SECRET = /authorization|cookie|token|secret|key|password/i;

  /* `changed` runs after a row is removed or a header name typed. */
  function bindHeaderRows(form, changed) {
    var tbody = form.querySelector("#header-rows tbody");
    var template = document.getElementById("header-row-template");
    var addButton = document.getElementById("add-header-row");
    if (!tbody || !template || !addButton) return;

    addButton.addEventListener("click", function () {
      tbody.appendChild(template.content.cloneNode(true));
      var rows = tbody.querySelectorAll("tr");
      rows[rows.length - 1].querySelector("input").focus();
    });
    tbody.addEventListener("click", function (event) {
      var button = event.target.closest(".remove-row");
      if (!button) return;
      var row = button.closest("tr");
      if (tbody.querySelectorAll("tr").length > 1) {
        row.remove();
      } else {
        row.querySelectorAll("input").forEach(function (input) { input.value = ""; });
      }
      changed();
    });
    tbody.addEventListener("input", function (event) {
      if (event.target.name !== "header_name") return;
      var value = event.target.closest("tr").querySelector("input[name=header_value]");
      value.type = SECRET.test(event.target.value) ? "password" : "text";
      changed();
    });
  }

  /* A Content-Type row decides the body type: JSON bodies are checked, others are sent as text. */
  function syncBodyFormat(form) {
    var select = form.querySelector("select[name=body_format]");
    var contentType = null;
    form.querySelectorAll("#header-rows tr").forEach(function (row) {
      var name = row.querySelector("input[name=header_name]");
      if (name && name.value.trim().toLowerCase() === "content-type") {
        contentType = row.querySelector("input[name=header_value]").value.toLowerCase();
      }
    });
    if (contentType !== null && contentType !== "") {
      select.value = /json/.test(contentType) ? "json" : "text";
    }
    checkBody(form);
  }

  function checkBody(form) {
    var body = form.querySelector("textarea[name=body]");
    var format = form.querySelector("select[name=body_format]");
    var status = document.getElementById("body-status");
    var formatButton = document.getElementById("format-body");
    var isJSON = format.value === "json";
    formatButton.hidden = !isJSON;
    body.classList.remove("is-valid", "is-invalid");
    body.removeAttribute("aria-invalid");
    if (!isJSON) { status.textContent = "Sent as text, exactly as written."; status.className = "hint"; return true; }
    if (!body.value.trim()) { status.textContent = "No body."; status.className = "hint"; return true; }
    try {
      JSON.parse(body.value);
      status.textContent = "✓ Valid JSON";
      status.className = "hint ok";
      body.classList.add("is-valid");
      return true;
    } catch (error) {
      status.textContent = "✗ Invalid JSON: " + error.message;
      status.className = "hint bad";
      body.classList.add("is-invalid");
      body.setAttribute("aria-invalid", "true");
      return false;
    }
  }

  function bindBody(form) {
    var body = form.querySelector("textarea[name=body]");
    var format = form.querySelector("select[name=body_format]");
    body.addEventListener("input", function () { checkBody(form); });
    format.addEventListener("change", function () { checkBody(form); });
    document.getElementById("format-body").addEventListener("click", function () {
      if (!checkBody(form) || !body.value.trim()) return;
      body.value = JSON.stringify(JSON.parse(body.value), null, 2);
    });
    checkBody(form);
  }

  SA.bindRequestSpec = function (form) {
    if (!document.getElementById("format-body")) {
      bindHeaderRows(form, function () {});
      return;
    }
    bindHeaderRows(form, function () { syncBodyFormat(form); });
    bindBody(form);
  };
})();
