// statekernel web view: live pages over Server-Sent Events; parts are swapped with htmx.
(function () {
  "use strict";

  function swap(url, target) {
    if (window.htmx) {
      return window.htmx.ajax("GET", url, { target: target, swap: "innerHTML" });
    }
    return fetch(url).then(function (r) { return r.text(); })
      .then(function (html) { target.innerHTML = html; });
  }

  function later(fn, ms) {
    var timer = null;
    return function () {
      if (timer) { clearTimeout(timer); }
      timer = setTimeout(function () { timer = null; fn(); }, ms);
    };
  }

  function followRun(live) {
    var after = live.getAttribute("data-after");
    var source = new EventSource(live.getAttribute("data-stream") + "?after=" + after);
    var rows = document.getElementById("events");
    var refresh = later(function () {
      swap(live.getAttribute("data-fragment"), live);
      var img = document.getElementById("diagram");
      if (img) { img.src = img.src.replace(/\?r=.*$/, "") + "?r=" + Date.now(); }
    }, 150);
    var streaming = document.getElementById("streaming");
    source.addEventListener("events", function (e) {
      if (rows) { rows.insertAdjacentHTML("beforeend", e.data); }
      if (streaming) { streaming.textContent = ""; streaming.hidden = true; }
    });
    source.addEventListener("live", function (e) {
      var event = JSON.parse(e.data);
      var text = event.data && event.data.text;
      if (!streaming || typeof text !== "string") { return; }
      if (event.type !== "text_delta" && event.type !== "reasoning_delta") { return; }
      streaming.hidden = false;
      streaming.appendChild(document.createTextNode(text));
    });
    source.addEventListener("run", function (e) {
      var run = JSON.parse(e.data);
      live.setAttribute("data-after", String(run.revision));
      document.body.setAttribute("data-revision", String(run.revision));
      refresh();
    });
    source.addEventListener("gone", function () { source.close(); });
  }

  function followList(box) {
    var source = new EventSource(box.getAttribute("data-stream"));
    var refresh = later(function () { swap(box.getAttribute("data-refresh"), box); }, 300);
    source.addEventListener("changed", refresh);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var live = document.getElementById("live");
    if (live && live.getAttribute("data-stream")) { followRun(live); }
    var runs = document.getElementById("runs");
    if (runs && runs.getAttribute("data-stream")) { followList(runs); }
  });
})();
