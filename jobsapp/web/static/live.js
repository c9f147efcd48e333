// Live pages: every few seconds, fetch this page's main region again and swap it in.
// The server renders only that region when asked with the X-Jobsapp-Live header,
// so a tick costs the page's queries and no layout. No build step: plain ES2017.
(function () {
  "use strict";
  var page = document.querySelector("main[data-live]");
  var main = document.getElementById("live-region");
  var control = document.getElementById("live");
  if (!page || !main || !control) { return; }
  var every = Math.max(1000, Number(page.getAttribute("data-live")) || 5000);
  var status = document.getElementById("live-status");
  var key = "jobsapp.live.paused";
  var paused = window.localStorage.getItem(key) === "1";
  var busy = false;
  // After a refusal (a 503 while a query is slow, the database down) the next tick waits
  // twice as long, up to MAX_WAIT; a page that answers again brings the pace back. A page
  // that answered slowly says how long to wait (X-Jobsapp-Live-Every: ten times its time).
  var MAX_WAIT = 60000;
  var wait = every;

  function paced(reply) {
    var asked = Number(reply.headers.get("X-Jobsapp-Live-Every"));
    return asked > 0 ? Math.min(MAX_WAIT, Math.max(1000, asked)) : every;
  }

  function show(text) { status.textContent = text; }

  function render() {
    control.hidden = false;
    control.textContent = paused ? "Resume live updates" : "Pause live updates";
    control.setAttribute("aria-pressed", paused ? "true" : "false");
    show(paused ? "paused" : "live");
  }

  // An operator typing a reason or ticking rows must not lose it to a refresh.
  function editing() {
    var active = document.activeElement;
    if (active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA|BUTTON|SUMMARY)$/.test(active.tagName)) {
      return true;
    }
    var fields = main.querySelectorAll("input, select, textarea, details[open]");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.tagName === "DETAILS") { return true; }
      if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) { return true; }
      } else if (f.tagName === "SELECT") {
        for (var j = 0; j < f.options.length; j++) {
          if (f.options[j].selected !== f.options[j].defaultSelected) { return true; }
        }
      } else if (f.type !== "hidden" && f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function tick() {
    if (paused || busy || document.hidden || editing()) { return Promise.resolve(); }
    busy = true;
    return fetch(window.location.href, {
      headers: { "X-Jobsapp-Live": "1" }, credentials: "same-origin",
      redirect: "manual", cache: "no-store"
    }).then(function (reply) {
      if (reply.status !== 200) { throw new Error("HTTP " + reply.status); }
      wait = paced(reply);
      return reply.text();
    }).then(function (html) {
      if (!paused && !editing()) {
        main.innerHTML = html;
        show("live, updated " + new Date().toLocaleTimeString());
      }
    }).catch(function (err) {
      wait = Math.min(MAX_WAIT, wait * 2);
      show("not updated (" + err.message + "); next try in " + Math.round(wait / 1000) + " s");
    }).then(function () { busy = false; });
  }

  function schedule() {
    window.setTimeout(function () { tick().then(schedule); }, wait);
  }

  control.addEventListener("click", function () {
    paused = !paused;
    window.localStorage.setItem(key, paused ? "1" : "0");
    render();
    if (!paused) { tick(); }
  });
  render();
  schedule();
}());
