/* moeperf dashboard: draws the index (a row per suite and family, SVG sparklines) and the metric pages (uPlot),
   and filters both in the page: suite, fingerprint, host, branch, time window. The filters live in the URL's hash,
   so a filtered view is a link. Nothing is fetched: the data came with the page (window.MOEPERF_PAGE) and
   data/sessions.js (window.MOEPERF_SESSIONS). */
(function () {
  "use strict";
  var S = window.MOEPERF_SESSIONS, P = window.MOEPERF_PAGE;
  var STATUSES = ["REGRESSED", "INCONCLUSIVE", "IMPROVED", "MISSING", "NEW", "PASS"];
  var COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f", "#e377c2"];
  var MARK = {REGRESSED: "#c62828", IMPROVED: "#1565c0", INCONCLUSIVE: "#ef6c00"};
  var STEP = "#d81b60";
  var WINDOWS = [["", "all"], ["7", "last 7 days"], ["30", "last 30 days"], ["90", "last 90 days"]];
  var FILTERS = [["suite", "suite"], ["fp", "fingerprint"], ["host", "host"], ["branch", "branch"],
                 ["days", "window"]];
  var state = parseHash();
  var latest = Date.parse(S.latest);

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (attrs[k] !== null && attrs[k] !== undefined) node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }
  function svg(tag, attrs) {
    var node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    return node;
  }
  function unique(values) { return Array.from(new Set(values)).sort(); }
  function pct(x, digits) { return x === null || x === undefined ? "-" : (x > 0 ? "+" : "") + (x * 100).toFixed(digits === undefined ? 1 : digits) + " %"; }
  function fmt(x) { return x === null || x === undefined ? "-" : Number(x.toPrecision(4)).toString(); }
  function when(t) { return t ? t.replace("T", " ").slice(0, 16) : "-"; }
  function worse(rel, better) { return (better || P.better) === "higher" ? rel < 0 : rel > 0; }

  function session(sid) {
    var r = S.sessions[sid];
    return {id: +sid, t: r[0], commit: r[1], dirty: r[2], branch: r[3], lane: r[4], versions: S.versions[r[5]] || {}};
  }
  function laneName(i) { return S.lanes[i].host + " · " + S.lanes[i].fingerprint; }
  function laneShown(i) {
    var l = S.lanes[i];
    return (!state.fp || l.fingerprint === state.fp) && (!state.host || l.host === state.host);
  }
  function sessionShown(sid) {
    var r = S.sessions[sid];
    if (!r || !laneShown(r[4]) || (state.branch && r[3] !== state.branch)) return false;
    return !state.days || Date.parse(r[0]) >= latest - Number(state.days) * 864e5;
  }
  function commitNode(s) {
    if (!s.commit) return el("span", {text: "no commit"});
    var text = s.commit.slice(0, 10) + (s.dirty ? "+" : "");
    return S.commit_url ? el("a", {href: S.commit_url.replace("{commit}", s.commit), title: s.commit, text: text})
                        : el("code", {title: s.commit, text: text});
  }
  function versionsText(v) { return Object.keys(v).sort().map(function (k) { return k + " " + v[k]; }).join(", "); }

  function parseHash() {
    var st = {suite: "", fp: "", host: "", branch: "", days: ""};
    location.hash.slice(1).split("&").forEach(function (kv) {
      var i = kv.indexOf("=");
      if (i > 0) { var k = decodeURIComponent(kv.slice(0, i)); if (k in st) st[k] = decodeURIComponent(kv.slice(i + 1)); }
    });
    return st;
  }
  function hash() {
    return Object.keys(state).filter(function (k) { return state[k]; })
      .map(function (k) { return encodeURIComponent(k) + "=" + encodeURIComponent(state[k]); }).join("&");
  }
  function link(href) { var h = hash(); return h ? href + "#" + h : href; }

  function buildFilters(draw) {
    var form = document.getElementById("filters");
    var choices = {
      suite: P.kind === "index" ? unique(P.rows.map(function (r) { return r.suite; })) : null,
      fp: unique(S.lanes.map(function (l) { return l.fingerprint; })),
      host: unique(S.lanes.map(function (l) { return l.host; })),
      branch: unique(Object.keys(S.sessions).map(function (k) { return S.sessions[k][3]; }).filter(Boolean))
    };
    FILTERS.forEach(function (f) {
      var name = f[0];
      if (name !== "days" && !choices[name]) return;
      var options = name === "days" ? WINDOWS : [["", "all"]].concat(choices[name].map(function (v) { return [v, v]; }));
      var select = el("select", {id: "f-" + name, name: name},
        options.map(function (o) { return el("option", {value: o[0], text: o[1]}); }));
      select.value = state[name];
      if (select.value !== state[name]) state[name] = "";
      select.addEventListener("change", function () {
        state[name] = select.value;
        history.replaceState(null, "", location.pathname + location.search + (hash() ? "#" + hash() : ""));
        document.querySelectorAll("a.home").forEach(function (a) { a.href = link(a.getAttribute("href").split("#")[0]); });
        draw();
      });
      form.appendChild(el("label", {}, [f[1] + " ", select]));
    });
    document.querySelectorAll("a.home").forEach(function (a) { a.href = link(a.getAttribute("href")); });
  }

  function footer() {
    document.getElementById("footer").textContent = "Built from " + S.shown + " of " + S.total + " sessions of " +
      S.source + " (the last of each host), up to " + when(S.latest) + " UTC. Change points: the history's detector " +
      "(Apache Otava). Charts: uPlot (MIT), shipped with the page.";
  }

  /* ------------------------------------------------------------------ index */
  function sparkline(ys, marks) {
    // ys: the level per session, null where it has none (a case whose usual value is 0 and that was not 0): a gap.
    // At least 0.95 .. 1.05 tall: noise of a few percent stays small beside a step of ten
    var known = ys.filter(function (v) { return v !== null; });
    var w = 160, h = 30, pad = 3, lo = Math.min.apply(null, [0.95].concat(known)), hi = Math.max.apply(null, [1.05].concat(known));
    var span = Math.max(hi - lo, 1e-9), x = function (i) { return ys.length < 2 ? w / 2 : pad + i * (w - 2 * pad) / (ys.length - 1); };
    var y = function (v) { return h - pad - (v - lo) * (h - 2 * pad) / span; };
    var node = svg("svg", {width: w, height: h, viewBox: "0 0 " + w + " " + h, class: "spark"});
    var runs = [[]];
    ys.forEach(function (v, i) {
      if (v === null) { if (runs[runs.length - 1].length) runs.push([]); }
      else runs[runs.length - 1].push(x(i).toFixed(1) + "," + y(v).toFixed(1));
    });
    runs.forEach(function (r) {
      if (r.length > 1) node.appendChild(svg("polyline", {points: r.join(" "), fill: "none", stroke: "#455a64", "stroke-width": 1.2}));
      else if (r.length === 1) node.appendChild(svg("circle", {cx: r[0].split(",")[0], cy: r[0].split(",")[1], r: 1.2, fill: "#455a64"}));
    });
    marks.forEach(function (i) { if (ys[i] !== null) node.appendChild(svg("circle", {cx: x(i), cy: y(ys[i]), r: 2.8, fill: STEP, class: "step"})); });
    if (ys.length && ys[ys.length - 1] !== null) node.appendChild(svg("circle", {cx: x(ys.length - 1), cy: y(ys[ys.length - 1]), r: 2, fill: "#000"}));
    var title = svg("title", {}), gaps = ys.length - known.length;
    title.textContent = (known.length ? "level (median over cases of value / case median): " + fmt(Math.min.apply(null, known)) + " .. " +
      fmt(Math.max.apply(null, known)) + "; scale " + fmt(lo) + " .. " + fmt(hi) : "no level") +
      (gaps ? "; " + gaps + " session(s) without one (cases whose usual value is 0 were not 0)" : "");
    node.appendChild(title);
    return node;
  }

  function laneCell(row, l) {
    var shown = [];
    l.s.forEach(function (sid, i) { if (sessionShown(sid)) shown.push(i); });
    if (!shown.length) return null;
    var last = shown.slice(-P.spark), lastSid = l.s[shown[shown.length - 1]];
    var steps = l.steps.filter(function (g) { return sessionShown(g.s); });
    var marks = [];
    steps.forEach(function (g) { var i = last.map(function (j) { return l.s[j]; }).indexOf(g.s); if (i >= 0) marks.push(i); });
    var counts = l.k[shown[shown.length - 1]];
    var verdicts = el("span", {class: "counts", title: "verdicts of the latest session shown (#" + lastSid + ")"},
      STATUSES.map(function (s, i) { return counts[i] ? el("span", {class: "v " + s, text: counts[i] + " " + s}) : null; }));
    var stepNodes = steps.slice(0, 3).map(function (g) {
      var s = session(g.s);
      return el("a", {class: "stepflag " + (worse(g.rel, row.better) ? "worse" : "better"), href: link(g.pages[0]),
                      title: g.n + " of " + l.of + " cases have a change point at session #" + g.s},
        [(g.rel >= 0 ? "▲ " : "▼ ") + pct(g.rel) + (worse(g.rel, row.better) ? " worse" : " better") + " at " + (s.commit ? s.commit.slice(0, 7) : "#" + g.s) +
         " (" + g.n + "/" + l.of + " cases, " + when(s.t).slice(0, 10) + ")"]);
    });
    if (steps.length > 3) stepNodes.push(el("span", {class: "more", text: "and " + (steps.length - 3) + " more"}));
    return el("div", {class: "lane", "data-lane": S.lanes[l.lane].host, "data-steps": steps.length}, [
      el("span", {class: "lanename", style: "border-color:" + COLORS[l.lane % COLORS.length], text: laneName(l.lane)}),
      sparkline(last.map(function (i) { return l.y[i]; }), marks), verdicts,
      el("span", {class: "steps"}, stepNodes.length ? stepNodes : [el("span", {class: "none", text: "no change point"})])]);
  }

  function drawIndex() {
    var main = document.getElementById("main");
    main.textContent = "";
    var body = el("tbody"), rows = 0, stepped = 0;
    P.rows.forEach(function (row) {
      if (state.suite && row.suite !== state.suite) return;
      var cells = row.lanes.filter(function (l) { return laneShown(l.lane); }).map(function (l) { return laneCell(row, l); })
        .filter(Boolean);
      if (!cells.length) return;
      var steps = cells.reduce(function (n, c) { return n + Number(c.getAttribute("data-steps")); }, 0);
      rows += 1; stepped += steps ? 1 : 0;
      var cases = el("details", {}, [el("summary", {text: row.cases.length + " case(s)"}),
        el("ul", {}, row.cases.map(function (c) { return el("li", {}, [el("a", {href: link(c.page), text: c.case})]); }))]);
      body.appendChild(el("tr", {class: "family" + (steps ? " stepped" : ""), "data-suite": row.suite, "data-steps": steps}, [
        el("td", {class: "suite", text: row.suite}),
        el("td", {class: "fam"}, [el("b", {text: row.file.split("/").pop() + " · " + row.metric}),
                                  el("div", {class: "unit", text: row.unit + ", " + row.better + " is better"}), cases]),
        el("td", {class: "lanes"}, cells)]));
    });
    main.appendChild(el("p", {id: "summary", text: rows + " famil" + (rows === 1 ? "y" : "ies") + " shown, " + stepped +
      " with change points in the window. A sparkline is the family's level over the last " + P.spark +
      " sessions shown of each host (each case's value over its median; the scale spans at least ±5 %); red dots: change points."}));
    main.appendChild(el("table", {id: "index"}, [el("thead", {}, [el("tr", {}, [el("th", {text: "suite"}),
      el("th", {text: "family"}), el("th", {text: "hosts: level, latest verdicts, change points"})])]), body]));
  }

  /* ------------------------------------------------------------------ metric page */
  var chart = null;
  function drawMetric() {
    var main = document.getElementById("main");
    if (chart) { chart.destroy(); chart = null; }
    main.textContent = "";
    main.appendChild(el("p", {class: "unit", text: P.unit + ", " + P.better + " is better · suite " + P.suite}));
    var lanes = P.lanes.filter(function (l) { return laneShown(l.lane); }).map(function (l) {
      return {lane: l.lane, p: l.p.filter(function (p) { return sessionShown(p[0]); }),
              steps: l.steps.filter(function (s) { return sessionShown(s.s); })};
    }).filter(function (l) { return l.p.length; });
    var box = el("div", {id: "chart"});
    main.appendChild(box);
    if (!lanes.length) { box.textContent = "No session of this metric passes the filters."; return; }
    var xOf = {}, xs = [];
    lanes.forEach(function (l) { l.p.forEach(function (p) { xOf[p[0]] = Date.parse(session(p[0]).t) / 1000; }); });
    xs = unique(Object.keys(xOf).map(function (k) { return xOf[k]; })).map(Number).sort(function (a, b) { return a - b; });
    var at = {}; xs.forEach(function (x, i) { at[x] = i; });
    var data = [xs], series = [{}], bands = [];
    function column(points, value) {
      var ys = xs.map(function () { return null; });
      points.forEach(function (p) { var v = value(p); if (v !== null && v !== undefined) ys[at[xOf[p[0]]]] = v; });
      return ys;
    }
    lanes.forEach(function (l) {
      var color = COLORS[l.lane % COLORS.length];
      data.push(column(l.p, function (p) { return p[1]; }));
      series.push({label: laneName(l.lane), stroke: color, width: 1.5, spanGaps: true, points: {show: true, size: 5}});
      if (l.p.some(function (p) { return p[4] !== null; })) {
        data.push(column(l.p, function (p) { return p[4]; }));
        series.push({label: S.lanes[l.lane].host + " baseline", stroke: color + "99", width: 1, dash: [8, 4], spanGaps: true,
                     points: {show: false}});
        data.push(column(l.p, function (p) { return p[4] === null ? null : p[4] * (1 + (p[5] || 0)); }));
        series.push({label: "+ mde", stroke: color + "55", width: 1, dash: [2, 4], spanGaps: true, points: {show: false}});
        data.push(column(l.p, function (p) { return p[4] === null ? null : p[4] * (1 - (p[5] || 0)); }));
        series.push({label: "− mde", stroke: color + "55", width: 1, dash: [2, 4], spanGaps: true, points: {show: false}});
        bands.push({series: [data.length - 2, data.length - 1], fill: color + "1a"});
      }
    });
    Object.keys(MARK).forEach(function (status) {
      var points = [];
      lanes.forEach(function (l) { l.p.forEach(function (p) { if (p[3] === status) points.push(p); }); });
      if (!points.length) return;
      data.push(column(points, function (p) { return p[1]; }));
      series.push({label: status, stroke: MARK[status], width: 0, paths: function () { return null; },
                   points: {show: true, size: 11, width: 2, stroke: MARK[status], fill: MARK[status] + "55"}});
    });
    var steps = [];
    lanes.forEach(function (l) { l.steps.forEach(function (s) { steps.push({lane: l.lane, step: s, x: xOf[s.s]}); }); });
    function drawSteps(u) {
      var ctx = u.ctx, top = u.bbox.top, height = u.bbox.height;
      ctx.save();
      steps.forEach(function (s, k) {
        var left = Math.round(u.valToPos(s.x, "x", true));
        ctx.strokeStyle = STEP; ctx.lineWidth = 2 * devicePixelRatio; ctx.setLineDash([6, 4]);
        ctx.beginPath(); ctx.moveTo(left, top); ctx.lineTo(left, top + height); ctx.stroke();
        ctx.fillStyle = STEP; ctx.font = (11 * devicePixelRatio) + "px sans-serif"; ctx.textAlign = "left";
        ctx.fillText(pct(s.step.rel) + " " + (session(s.step.s).commit || "").slice(0, 7), left + 4, top + (14 + 13 * (k % 4)) * devicePixelRatio);
      });
      ctx.restore();
    }
    // the y range holds the medians and the baselines; a wide tolerance band is clipped rather than squashing them
    var seen = [];
    lanes.forEach(function (l) { l.p.forEach(function (p) { seen.push(p[1]); if (p[4] !== null) seen.push(p[4]); }); });
    var low = Math.min.apply(null, seen), high = Math.max.apply(null, seen);
    var pad = Math.max((high - low) * 0.08, Math.abs(high) * 0.01) || 1;  // a series of zeros (failed_rate): -1 .. 1
    chart = new uPlot({width: Math.max(480, Math.min(box.clientWidth || 1100, 1400)), height: 380, series: series,
                       bands: bands, scales: {x: {time: true}, y: {range: function () { return [low - pad, high + pad]; }}},
                       axes: [{}, {label: P.unit, size: 70}], legend: {live: false},
                       hooks: {draw: [drawSteps]}, cursor: {drag: {x: true, y: false}}}, data, box);
    chart.over.addEventListener("click", function () {
      var i = chart.cursor.idx; if (i === null || i === undefined) return;
      var row = null;
      Object.keys(xOf).forEach(function (sid) { if (xOf[sid] === xs[i]) row = document.getElementById("s" + sid); });
      if (row) { document.querySelectorAll("tr.hl").forEach(function (r) { r.classList.remove("hl"); }); row.classList.add("hl"); row.scrollIntoView({block: "center"}); }
    });
    main.appendChild(el("p", {class: "caption", text: "Each host's medians; dashed: its baseline, dotted and shaded: ± mde, the band a " +
      "verdict tolerates (clipped when wider than the data); large marks: REGRESSED, IMPROVED, INCONCLUSIVE; pink dashed lines: change points. Click a " +
      "point for its session below."}));
    stepTable(steps);
    sessionTable(lanes);
  }

  function stepTable(steps) {
    var main = document.getElementById("main");
    main.appendChild(el("h2", {text: "Change points (" + steps.length + ")"}));
    if (!steps.length) { main.appendChild(el("p", {id: "nosteps", text: "None in the sessions shown."})); return; }
    main.appendChild(el("table", {id: "steps"}, [el("thead", {}, [el("tr", {}, ["host", "first session of the new level",
      "commit", "finished (UTC)", "before → after", "step", "p", "versions changed since the session before"]
      .map(function (h) { return el("th", {text: h}); }))]),
      el("tbody", {}, steps.map(function (s) {
        var at = session(s.step.s);
        return el("tr", {class: worse(s.step.rel) ? "worse" : "better", "data-commit": at.commit || ""}, [
          el("td", {text: laneName(s.lane)}), el("td", {}, [el("a", {href: "#", "data-s": s.step.s, text: "#" + s.step.s})]),
          el("td", {}, [commitNode(at)]), el("td", {text: when(at.t)}),
          el("td", {text: fmt(s.step.before) + " → " + fmt(s.step.after) + " " + P.unit}), el("td", {text: pct(s.step.rel)}),
          el("td", {text: s.step.p === null ? "-" : s.step.p.toPrecision(2)}),
          el("td", {text: s.step.versions.length ? s.step.versions.join("; ") : "unchanged"})]);
      }))]));
    main.querySelectorAll("#steps a[data-s]").forEach(function (a) {
      a.addEventListener("click", function (e) { e.preventDefault(); var r = document.getElementById("s" + a.getAttribute("data-s")); if (r) r.scrollIntoView({block: "center"}); });
    });
  }

  function sessionTable(lanes) {
    var main = document.getElementById("main"), ab = {};
    P.ab.forEach(function (a) { (ab[a.s] = ab[a.s] || []).push(a); });
    var rows = [];
    lanes.forEach(function (l) { l.p.forEach(function (p) { rows.push({lane: l.lane, p: p}); }); });
    rows.sort(function (a, b) { return session(b.p[0]).t.localeCompare(session(a.p[0]).t) || b.p[0] - a.p[0]; });
    main.appendChild(el("h2", {text: "Sessions (" + rows.length + "), newest first"}));
    main.appendChild(el("table", {id: "points"}, [el("thead", {}, [el("tr", {}, ["session", "finished (UTC)", "host",
      "branch", "commit", "median", "IQR", "baseline ± mde", "Δ", "verdict", "reason", "software", "A/B at this commit"]
      .map(function (h) { return el("th", {text: h}); }))]),
      el("tbody", {}, rows.map(function (r) {
        var p = r.p, s = session(p[0]);
        var abNodes = (ab[p[0]] || []).map(function (a) {
          return el("div", {class: "ab " + a.status, title: a.reason || ""}, [a.status + " " + pct(a.change, 2) +
            (a.low !== null && a.high !== null ? " [" + pct(a.low, 1) + ", " + pct(a.high, 1) + "]" : "") +
            (a.p !== null ? " p=" + a.p.toPrecision(2) : "") + " vs " + a.base + " (" + a.report + ")"]);
        });
        return el("tr", {id: "s" + p[0], class: p[3], "data-lane": S.lanes[r.lane].host}, [
          el("td", {text: "#" + p[0]}), el("td", {text: when(s.t)}), el("td", {text: laneName(r.lane)}),
          el("td", {text: s.branch || "-"}), el("td", {}, [commitNode(s)]), el("td", {text: fmt(p[1])}),
          el("td", {text: fmt(p[2])}), el("td", {text: p[4] === null ? "-" : fmt(p[4]) + " ± " + pct(p[5], 0).replace("+", "")}),
          el("td", {text: pct(p[6])}), el("td", {class: "verdict", text: p[3]}), el("td", {class: "reason", text: p[7] || ""}),
          el("td", {class: "versions", text: versionsText(s.versions)}), el("td", {}, abNodes.length ? abNodes : ["-"])]);
      }))]));
  }

  function draw() {
    try {
      if (P.kind === "index") drawIndex(); else drawMetric();
      document.body.setAttribute("data-rendered", String(Number(document.body.getAttribute("data-rendered") || 0) + 1));
    } catch (e) {
      var box = document.getElementById("error");
      box.hidden = false; box.textContent = "The dashboard could not draw this page: " + e;
      throw e;
    }
  }
  if (P.kind === "metric") document.getElementById("title").textContent = P.file.split("/").pop() + " · " + P.key.split("::").slice(1).join("::");
  buildFilters(draw);
  footer();
  draw();
})();
