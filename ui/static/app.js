// durable ui: refreshes the overview's live section and keeps, while the
// page is open, a short history of each gate's active and blocked rows,
// drawn as sparklines. The live section is HTML the server rendered and
// escaped; gate names are read from data attributes and only ever used as
// map keys, never written into markup.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) return;
  var every = document.getElementById("every");
  var ms = Math.max(1000, parseInt(every && every.dataset.ms, 10) || 5000);
  var keep = 60; // samples per gate
  var history = new Map(); // gate name -> [{a, b}]
  var svgNS = "http://www.w3.org/2000/svg";

  function sample() {
    var seen = new Set();
    live.querySelectorAll("tr[data-gate]").forEach(function (tr) {
      var name = tr.dataset.gate;
      seen.add(name);
      var h = history.get(name) || [];
      h.push({ a: Number(tr.dataset.active) || 0, b: Number(tr.dataset.blocked) || 0 });
      if (h.length > keep) h.shift();
      history.set(name, h);
      draw(tr.querySelector("svg.spark"), h);
    });
    history.forEach(function (_, name) { if (!seen.has(name)) history.delete(name); });
  }

  // x spreads the samples so far over the width; y maps 0..top to the
  // bottom..top of the box, with a margin so a flat line at the top shows.
  function x(i, n) { return n === 1 ? 120 : (i * 120) / (n - 1); }
  function y(v, top) { return 22 - (v / top) * 18; }

  function points(h, pick, top) {
    var pts = h.map(function (s, i) { return x(i, h.length).toFixed(1) + "," + y(pick(s), top).toFixed(1); });
    if (h.length === 1) pts.unshift("0," + y(pick(h[0]), top).toFixed(1));
    return pts;
  }

  function draw(svg, h) {
    if (!svg) return;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var top = 1;
    h.forEach(function (s) { top = Math.max(top, s.a, s.b); });
    // Blocked rows as a filled area, active rows as a line over it.
    var area = document.createElementNS(svgNS, "polygon");
    var b = points(h, function (s) { return s.b; }, top);
    area.setAttribute("points", "0,22 " + b.join(" ") + " 120,22");
    area.setAttribute("class", "blocked");
    svg.appendChild(area);
    var pl = document.createElementNS(svgNS, "polyline");
    pl.setAttribute("points", points(h, function (s) { return s.a; }, top).join(" "));
    pl.setAttribute("class", "active");
    svg.appendChild(pl);
    var last = h[h.length - 1];
    var t = document.createElementNS(svgNS, "title");
    t.textContent = "now: " + last.a + " active, " + last.b + " blocked (" + h.length + " samples)";
    svg.appendChild(t);
  }

  function stamp() {
    var at = live.querySelector("#live-at");
    var taken = document.getElementById("taken");
    if (at && taken) {
      taken.textContent = at.dataset.at;
      taken.setAttribute("datetime", at.dataset.iso);
    }
  }

  function refresh() {
    fetch(live.dataset.src, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        // The fragment is the server's own html/template output.
        live.innerHTML = html;
        document.getElementById("stale").classList.add("hidden");
        stamp();
        sample();
      })
      .catch(function () {
        document.getElementById("stale").classList.remove("hidden");
      })
      .finally(function () { setTimeout(refresh, ms); });
  }

  sample();
  setTimeout(refresh, ms);
})();
