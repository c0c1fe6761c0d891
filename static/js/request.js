/* Request page: header rows, JSON body check as you type, scheduling in the browser's zone,
   and following a submitted call until its response arrives. */
(function () {
  "use strict";

  var SECRET = /authorization|cookie|token|secret|key|password/i;

  function bindHeaderRows(form) {
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
      syncBodyFormat(form);
    });
    tbody.addEventListener("input", function (event) {
      if (event.target.name !== "header_name") return;
      var value = event.target.closest("tr").querySelector("input[name=header_value]");
      value.type = SECRET.test(event.target.value) ? "password" : "text";
      syncBodyFormat(form);
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

  function pad(n) { return String(n).padStart(2, "0"); }

  function localInputValue(date) {
    return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) +
      "T" + pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds());
  }

  function bindSchedule(form) {
    var radios = form.querySelectorAll("input[name=when]");
    var fields = document.getElementById("schedule-fields");
    var local = form.querySelector("input[name=due_local]");
    var utcNote = document.getElementById("due-utc");

    function mode() {
      var checked = form.querySelector("input[name=when]:checked");
      return checked ? checked.value : "now";
    }
    function update() {
      var scheduled = mode() === "schedule";
      fields.hidden = !scheduled;
      if (scheduled && !local.value) {
        local.value = localInputValue(new Date(Date.now() + 5 * 60 * 1000));
      }
      var date = local.value ? new Date(local.value) : null;
      utcNote.textContent = scheduled && date && !isNaN(date) ? "= " + date.toISOString().replace(".000Z", "Z") + " (UTC)" : "";
    }
    radios.forEach(function (radio) { radio.addEventListener("change", update); });
    local.addEventListener("input", update);
    update();

    form.addEventListener("submit", function () {
      var dueAt = form.querySelector("input[name=due_at]");
      var offset = form.querySelector("input[name=tz_offset]");
      dueAt.value = "";
      offset.value = "";
      if (mode() !== "schedule" || !local.value) return;
      // new Date("YYYY-MM-DDTHH:MM") reads the browser's zone, DST of that very day included.
      var date = new Date(local.value);
      if (isNaN(date)) return;
      dueAt.value = date.toISOString();
      offset.value = String(date.getTimezoneOffset());
    });
  }

  function renderHeaders(headers) {
    var names = Object.keys(headers || {});
    if (!names.length) return '<p class="muted">No headers.</p>';
    return '<table class="kv-table"><tbody>' + names.map(function (name) {
      return '<tr><th scope="row" class="mono">' + SA.escapeHTML(name) + '</th><td class="mono break">' +
        SA.escapeHTML(headers[name]) + "</td></tr>";
    }).join("") + "</tbody></table>";
  }

  function prettyBody(text) {
    if (text == null || text === "") return null;
    try { return JSON.stringify(JSON.parse(text), null, 2); } catch (e) { return text; }
  }

  function renderOutcome(outcome) {
    if (!outcome) return '<p class="muted">No outcome recorded.</p>';
    var html = "";
    var meta = outcome.responseMeta;
    if (meta) {
      html += '<h3>Response <span class="http-status ok">' + SA.escapeHTML(meta.status) + "</span></h3>";
      html += '<p class="muted small">Latency ' + SA.escapeHTML(meta.latencyMs) + " ms" + (meta.bodyTruncated ? " · body truncated" : "") + "</p>";
    } else {
      meta = outcome.errorMeta || {};
      html += '<h3>Error <span class="error-kind">' + SA.escapeHTML(meta.kind) + "</span>" +
        (meta.status ? ' <span class="http-status bad">' + SA.escapeHTML(meta.status) + "</span>" : "") + "</h3>";
      html += '<p class="error-message">' + SA.escapeHTML(meta.message) + "</p>";
    }
    if (meta.headers) html += "<h4>Headers</h4>" + renderHeaders(meta.headers);
    var body = prettyBody(meta.bodySnippet);
    if (body !== null) html += '<h4>Body</h4><pre class="code" id="response-body">' + SA.escapeHTML(body) + "</pre>";
    else if (outcome.responseMeta) html += '<h4>Body</h4><p class="muted">Empty body.</p>';
    return html;
  }

  function follow() {
    var panel = document.getElementById("result");
    if (!panel) return;
    var url = panel.getAttribute("data-live-url");
    var shown = null;
    SA.poll(function () {
      return SA.fetchJSON(url).then(function (call) {
        if (call.status !== shown) {
          shown = call.status;
          panel.setAttribute("data-status", call.status);
          document.getElementById("result-status").innerHTML = SA.badgeHTML(call.status);
          document.getElementById("result-started").innerHTML = SA.timeHTML(call.startedAt);
          document.getElementById("result-finished").innerHTML = SA.timeHTML(call.finishedAt);
        }
        if (!SA.isTerminal(call.status)) return false;
        document.getElementById("response").innerHTML = renderOutcome(call.outcome);
        return true;
      });
    }, 400);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = document.getElementById("request-form");
    if (!form) return;
    bindHeaderRows(form);
    bindBody(form);
    bindSchedule(form);
    follow();
  });
})();
