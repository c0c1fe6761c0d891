/* New schedule page: a live preview of the next runs in the chosen time zone, asked from the
   API's preview (the session works there; a GET needs no CSRF token) as the user types; the
   request itself is request_spec.js's editor. Without JavaScript the form still works; the page
   shows the preview after a submit that needs correcting. */
(function () {
  "use strict";

  var DELAY_MS = 250;

  /* "Sun 28 Mar 2027, 03:00 CEST": the run as the schedule's zone shows it, named as the server
     names the zone on every page (a browser's locale may say "GMT+5:30" where the pages say IST). */
  function localText(run, zone) {
    var date = new Date(run.at);
    try {
      return new Intl.DateTimeFormat(undefined, {
        weekday: "short", year: "numeric", month: "short", day: "numeric",
        hour: "2-digit", minute: "2-digit", hour12: false, timeZone: zone
      }).format(date) + (run.zoneName ? " " + run.zoneName : "");
    } catch (error) {
      return run.at;
    }
  }

  function firstError(errors, names) {
    for (var i = 0; i < names.length; i++) {
      if (errors && errors[names[i]] && errors[names[i]].length) return errors[names[i]][0];
    }
    return null;
  }

  function bindPreview(form) {
    var card = document.getElementById("schedule-preview-card");
    var list = document.getElementById("schedule-preview");
    var status = document.getElementById("preview-status");
    var cron = form.querySelector("input[name=cron]");
    var zone = form.querySelector("input[name=timezone]");
    if (!card || !list || !status || !cron || !zone) return;
    var url = card.getAttribute("data-preview-url");
    var timer = null;
    var asked = 0;

    if (!zone.value) {
      // The browser's own zone is the likely one; the user can change it.
      zone.value = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
    }

    function show(data) {
      list.innerHTML = data.nextRuns.map(function (run) {
        return '<li data-local="' + SA.escapeHTML(run.local) + '" title="' + SA.escapeHTML(run.at) + '">' +
          SA.escapeHTML(localText(run, data.timezone)) + ' <span class="muted mono small">' +
          SA.escapeHTML(run.local) + "</span></li>";
      }).join("");
      status.className = "hint ok";
      status.textContent = data.nextRuns.length ? "Next runs in " + data.timezone + ":" : "No run ahead.";
    }

    function refuse(message) {
      list.innerHTML = "";
      status.className = "hint bad";
      status.textContent = message;
    }

    function ask() {
      var text = cron.value.trim();
      if (!text) {
        list.innerHTML = "";
        status.className = "hint";
        status.textContent = "Type a cron to see its next runs in the chosen time zone.";
        return;
      }
      var query = "?cron=" + encodeURIComponent(text) + (zone.value.trim() ? "&timezone=" + encodeURIComponent(zone.value.trim()) : "");
      var mine = ++asked;
      status.className = "hint";
      status.textContent = "Working out the next runs…";
      SA.fetchJSON(url + query).then(function (data) {
        if (mine === asked) show(data);
      }).catch(function (error) {
        if (mine !== asked) return;
        var message = firstError(error.data && error.data.errors, ["cron", "timezone"]);
        refuse(message || error.message);
      });
    }

    function later() {
      clearTimeout(timer);
      timer = setTimeout(ask, DELAY_MS);
    }

    cron.addEventListener("input", later);
    zone.addEventListener("input", later);
    zone.addEventListener("change", later);
    if (cron.value.trim()) ask();
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = document.getElementById("schedule-form");
    if (!form) return;
    SA.bindRequestSpec(form);
    bindPreview(form);
  });
})();
