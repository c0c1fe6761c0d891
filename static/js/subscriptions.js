/* Subscription and Signing pages: copy the once-shown secret; send the recover time in UTC too. */
(function () {
  "use strict";

  function selectText(el) {
    var range = document.createRange();
    range.selectNodeContents(el);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function bindCopy() {
    var button = document.getElementById("copy-secret");
    if (!button) return;
    var target = document.getElementById(button.getAttribute("data-copy-target"));
    var status = document.getElementById("copy-status");
    button.addEventListener("click", function () {
      var text = target.textContent.trim();
      function byHand() {
        selectText(target);
        status.textContent = "Selected: press Ctrl+C (⌘C) to copy.";
      }
      if (!navigator.clipboard || !window.isSecureContext) return byHand();
      navigator.clipboard.writeText(text).then(function () {
        status.textContent = "Copied.";
      }, byHand);
    });
  }

  function bindRecover() {
    var form = document.getElementById("recover-form");
    if (!form) return;
    form.addEventListener("submit", function () {
      var local = form.querySelector("input[name=since_local]");
      var since = form.querySelector("input[name=since]");
      var offset = form.querySelector("input[name=tz_offset]");
      since.value = "";
      offset.value = "";
      if (!local.value) return;
      // new Date("YYYY-MM-DDTHH:MM") reads the browser's zone, DST of that very day included.
      var date = new Date(local.value);
      if (isNaN(date)) return;
      since.value = date.toISOString();
      offset.value = String(date.getTimezoneOffset());
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    bindCopy();
    bindRecover();
  });

  /* Deliveries still on their way (a test event just sent) follow without a reload, as the
     Calls page does: the page is read again and each changed delivery replaced. */
  function followDeliveries() {
    var table = document.querySelector("table.deliveries");
    if (!table || !window.fetch || !window.DOMParser) return;
    function open() { return table.querySelector('tbody.delivery[data-state="PENDING"], tbody.delivery[data-state="FAILED"]'); }
    if (!open()) return;
    SA.poll(function () {
      return fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (answer) {
          if (!answer.ok) throw new Error("the page answered " + answer.status);  // SA.poll waits longer
          return answer.text();
        })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html");
          fresh.querySelectorAll("table.deliveries tbody.delivery").forEach(function (body) {
            var shown = document.getElementById(body.id);
            if (shown && shown.getAttribute("data-state") !== body.getAttribute("data-state")) {
              shown.replaceWith(document.importNode(body, true));
            }
          });
          SA.localizeTimes(table);
          return !open();
        });
    }, 1000);
  }

  document.addEventListener("DOMContentLoaded", followDeliveries);
})();
