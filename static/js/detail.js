/* Details page: while the call is unfinished, reload when its status changes; "Run at a chosen
   time" takes the time in the browser's zone and sends it in UTC as well. */
(function () {
  "use strict";

  function bindRerunLater() {
    var form = document.getElementById("rerun-later-form");
    if (!form) return;
    var details = form.closest("details");
    var local = form.querySelector("input[name=due_local]");
    var utcNote = document.getElementById("rerun-due-utc");

    function update() {
      var date = local.value ? new Date(local.value) : null;
      utcNote.textContent = date && !isNaN(date) ? "= " + date.toISOString().replace(".000Z", "Z") + " (UTC)" : "";
    }
    details.addEventListener("toggle", function () {
      if (!details.open) return;
      if (!local.value) local.value = SA.localInputValue(new Date(Date.now() + 60 * 60 * 1000));
      update();
      local.focus();
    });
    local.addEventListener("input", update);
    form.addEventListener("submit", function () {
      var dueAt = form.querySelector("input[name=due_at]");
      var offset = form.querySelector("input[name=tz_offset]");
      dueAt.value = "";
      offset.value = "";
      // new Date("YYYY-MM-DDTHH:MM") reads the browser's zone, DST of that very day included.
      var date = local.value ? new Date(local.value) : null;
      if (!date || isNaN(date)) return;
      dueAt.value = date.toISOString();
      offset.value = String(date.getTimezoneOffset());
    });
  }

  function followStatus() {
    var head = document.getElementById("call");
    if (!head || SA.isTerminal(head.getAttribute("data-status"))) return;
    var shown = head.getAttribute("data-status");
    SA.poll(function () {
      // Not while a time is being chosen: the reload would drop it.
      var later = document.querySelector("details.rerun-later");
      if (later && later.open) return false;
      return SA.fetchJSON(head.getAttribute("data-live-url")).then(function (call) {
        if (call.status !== shown) {
          window.location.reload();
          return true;
        }
        return false;
      });
    }, 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    bindRerunLater();
    followStatus();
  });
})();
