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
})();
