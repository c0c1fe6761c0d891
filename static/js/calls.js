/* Status page: refresh the statuses and outcomes of unfinished calls without reloading. */
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var table = document.getElementById("calls-table");
    if (!table) return;
    var url = table.getAttribute("data-live-url");

    function pendingRows() {
      return Array.prototype.filter.call(table.querySelectorAll("tbody tr[data-id]"), function (row) {
        return !SA.isTerminal(row.getAttribute("data-status"));
      });
    }

    function refresh() {
      var rows = pendingRows();
      if (!rows.length) return true;
      var query = rows.map(function (row) { return "id=" + encodeURIComponent(row.getAttribute("data-id")); }).join("&");
      return SA.fetchJSON(url + "?" + query).then(function (data) {
        (data.calls || []).forEach(function (call) {
          var row = table.querySelector('tr[data-id="' + call.serviceCallId + '"]');
          if (!row || row.getAttribute("data-status") === call.status) return;
          row.setAttribute("data-status", call.status);
          row.querySelector(".status-cell").innerHTML = SA.badgeHTML(call.status);
          row.querySelector(".execution").innerHTML = call.startedAt
            ? '<span class="muted">started</span> ' + SA.timeHTML(call.startedAt)
            : '<span class="muted">due</span> ' + SA.timeHTML(call.dueAt);
          // Rendered (and escaped) by the server, exactly as the page renders the cell.
          row.querySelector(".outcome-cell").innerHTML = call.outcomeHtml;
          // Only a Scheduled call can be cancelled: the control goes once it has started.
          var cancel = row.querySelector(".row-cancel");
          if (cancel && call.status !== "Scheduled") cancel.parentNode.removeChild(cancel);
          row.classList.add("flash");
          setTimeout(function () { row.classList.remove("flash"); }, 1200);
        });
        return pendingRows().length === 0;
      });
    }

    if (pendingRows().length) SA.poll(refresh, 1000);
  });

  // The filters' empty fields stay out of the URL (no "tag=&q="): a link to the list stays short.
  document.addEventListener("DOMContentLoaded", function () {
    var filters = document.getElementById("filters");
    if (!filters) return;
    filters.addEventListener("formdata", function (event) {
      Array.from(event.formData.entries()).forEach(function (entry) {
        if (entry[1] === "") event.formData.delete(entry[0]);
      });
    });
  });
})();
