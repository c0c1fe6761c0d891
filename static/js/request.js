/* Request page: scheduling in the browser's zone, and following a submitted call until its
   response arrives; the request itself is request_spec.js's editor. */
(function () {
  "use strict";

  function bindSchedule(form) {
    var radios = form.querySelectorAll("input[name=when]");
    var fields = document.getElementById("schedule-fields");
    var local = form.querySelector("input[name=due_local]");
    var utcNote = document.getElementById("due-utc");
    var pastNote = document.getElementById("due-past");

    function mode() {
      var checked = form.querySelector("input[name=when]:checked");
      return checked ? checked.value : "now";
    }
    function update() {
      var scheduled = mode() === "schedule";
      fields.hidden = !scheduled;
      if (scheduled && !local.value) {
        local.value = SA.localInputValue(new Date(Date.now() + 5 * 60 * 1000));
      }
      var date = local.value ? new Date(local.value) : null;
      utcNote.textContent = scheduled && date && !isNaN(date) ? "= " + date.toISOString().replace(".000Z", "Z") + " (UTC)" : "";
      // Said before sending: a time more than a minute ago runs the call at once (the page asks to confirm).
      pastNote.hidden = !(scheduled && date && !isNaN(date) && date.getTime() < Date.now() - 60 * 1000);
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
    SA.bindRequestSpec(form);
    bindSchedule(form);
    follow();
  });
})();
