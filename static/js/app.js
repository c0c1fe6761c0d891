/* Service Agent: small helpers shared by every page (no libraries, works offline). */
(function () {
  "use strict";

  var TERMINAL = ["Succeeded", "Failed", "Cancelled"];

  function csrfToken() {
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    if (match) return decodeURIComponent(match[1]);
    var input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function pad(n) { return String(n).padStart(2, "0"); }

  /* A datetime-local input's value ("YYYY-MM-DDTHH:MM:SS") for a date, in the browser's zone. */
  function localInputValue(date) {
    return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) +
      "T" + pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds());
  }

  /* fetch with the session cookie and the CSRF token; resolves to parsed JSON or throws. */
  function fetchJSON(url, options) {
    options = options || {};
    var headers = Object.assign({ "Accept": "application/json", "X-Requested-With": "fetch" }, options.headers || {});
    var method = (options.method || "GET").toUpperCase();
    if (method !== "GET" && method !== "HEAD") headers["X-CSRFToken"] = csrfToken();
    return fetch(url, Object.assign({}, options, { headers: headers, credentials: "same-origin" })).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (!response.ok) {
          var error = new Error(data.detail || ("HTTP " + response.status));
          error.status = response.status;
          error.data = data;
          throw error;
        }
        return data;
      });
    });
  }

  var localFormat = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false
  });

  var preciseFormat = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit", fractionalSecondDigits: 3, hour12: false
  });

  function formatLocal(iso, precise) {
    if (!iso) return "—";
    var date = new Date(iso);
    return isNaN(date) ? iso : (precise ? preciseFormat : localFormat).format(date);
  }

  /* <time datetime="...Z" title="... UTC"> rendered by the server: show it in the browser's zone. */
  function localizeTimes(root) {
    (root || document).querySelectorAll("time[datetime]:not([data-localized])").forEach(function (el) {
      el.textContent = formatLocal(el.getAttribute("datetime"), el.hasAttribute("data-ms"));
      el.setAttribute("data-localized", "");
    });
  }

  function escapeHTML(text) {
    return String(text == null ? "" : text).replace(/[&<>"']/g, function (ch) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[ch];
    });
  }

  function timeHTML(iso) {
    if (!iso) return '<span class="muted">—</span>';
    var utc = iso.replace("T", " ").replace("Z", "");
    return '<time datetime="' + escapeHTML(iso) + '" title="' + escapeHTML(utc) + ' UTC" data-localized>' +
      escapeHTML(formatLocal(iso)) + "</time>";
  }

  function badgeHTML(status) {
    return '<span class="badge badge-' + escapeHTML(String(status).toLowerCase()) + '">' + escapeHTML(status) + "</span>";
  }

  function isTerminal(status) { return TERMINAL.indexOf(status) >= 0; }

  /* Poll fn every `interval` ms until it resolves true; slows down after a minute. */
  function poll(fn, interval) {
    var started = Date.now();
    function tick() {
      Promise.resolve().then(fn).then(function (done) {
        if (done) return;
        var wait = Date.now() - started > 60000 ? Math.max(interval, 5000) : interval;
        setTimeout(tick, wait);
      }, function () { setTimeout(tick, Math.max(interval, 3000)); });
    }
    setTimeout(tick, interval);
  }

  function bindAutosubmit() {
    document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
      select.addEventListener("change", function () {
        var form = select.form;
        if (form) form.requestSubmit ? form.requestSubmit() : form.submit();
      });
    });
  }

  /* Stars toggle in place; without JavaScript the form posts and the page reloads. */
  function bindStars() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      if (!form.classList || !form.classList.contains("star-form")) return;
      event.preventDefault();
      var button = form.querySelector("button.star");
      var field = form.querySelector("input[name=favorite]");
      var body = new FormData(form);
      button.disabled = true;
      fetchJSON(form.action, { method: "POST", body: body }).then(function (data) {
        var on = !!data.favorite;
        field.value = on ? "" : "on";
        button.classList.toggle("is-on", on);
        button.setAttribute("aria-pressed", on ? "true" : "false");
        var label = on ? "Remove from favorites" : "Add to favorites";
        button.setAttribute("aria-label", label);
        button.title = label;
        button.textContent = on ? "★" : "☆";
      }).catch(function (error) {
        window.alert("Could not change the star: " + error.message);
      }).finally(function () { button.disabled = false; });
    });
  }

  function showBrowserZone() {
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
    document.querySelectorAll("[data-browser-tz]").forEach(function (el) { el.textContent = zone; });
  }

  window.SA = {
    csrfToken: csrfToken, fetchJSON: fetchJSON, formatLocal: formatLocal, localizeTimes: localizeTimes,
    escapeHTML: escapeHTML, timeHTML: timeHTML, badgeHTML: badgeHTML, isTerminal: isTerminal, poll: poll,
    localInputValue: localInputValue
  };

  document.addEventListener("DOMContentLoaded", function () {
    localizeTimes(document);
    bindAutosubmit();
    bindStars();
    showBrowserZone();
  });
})();
