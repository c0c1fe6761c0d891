/* Details page: while the call is unfinished, reload when its status changes. */
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var head = document.getElementById("call");
    if (!head || SA.isTerminal(head.getAttribute("data-status"))) return;
    var shown = head.getAttribute("data-status");
    SA.poll(function () {
      return SA.fetchJSON(head.getAttribute("data-live-url")).then(function (call) {
        if (call.status !== shown) {
          window.location.reload();
          return true;
        }
        return false;
      });
    }, 1000);
  });
})();
