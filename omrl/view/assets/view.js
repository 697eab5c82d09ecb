/* omrl view: the page's script, inlined into the HTML (no framework, no build step, no network
 * but the page's own server). Every piece of run data reaches the page as a text node or an
 * attribute value, never as HTML: model and env text is shown exactly as it was. */
"use strict";
(function () {
  const embedded = document.getElementById("omrl-data");
  const saved = embedded ? JSON.parse(embedded.textContent) : null;
  const home = saved ? localApi(saved) : remoteApi("api/");
  const main = document.querySelector("main");
  const tip = document.querySelector(".tip");
  const PALETTE = ["#2f5fd0", "#d9480f", "#2b8a3e", "#ae3ec9", "#e67700", "#0c8599", "#c2255c", "#5c7cfa", "#495057"];
  let api = home;  // the run shown now: the only one, or one side of a comparison
  let run = null;
  let side = "";  // "a" or "b" on the pages of one side of a comparison, else ""
  let comparison = null;  // the comparison of two evals (omrl view A B), else null
  const sides = {};  // a comparison's sides: {a: {api, run}, b: {api, run}}

  /** The address of a view of the run shown now ("episode/3" -> "#/a/episode/3" on side a). */
  function at(path) { return "#/" + (side ? side + "/" : "") + path; }

  // ---- DOM helpers ------------------------------------------------------------------------
  /** h("td", {class: "num"}, "text", child): strings become text nodes, so data is never parsed as HTML. */
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    setProps(el, props);
    append(el, children);
    return el;
  }
  function s(tag, attrs, ...children) {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    setProps(el, attrs);
    append(el, children);
    return el;
  }
  function setProps(el, props) {
    for (const [key, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  function append(el, children) {
    for (const child of children.flat(Infinity)) {
      if (child === undefined || child === null || child === false) continue;
      el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }
  function fmt(x, digits) {
    if (x === null || x === undefined) return "–";
    if (typeof x !== "number") return String(x);
    if (Number.isSafeInteger(x)) return String(x);  // ids and counts whole: task 1000000, not 1.00e+6
    const a = Math.abs(x);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(2);
    return x.toFixed(digits === undefined ? 3 : digits).replace(/\.?0+$/, "") || "0";
  }
  function known(x) { return x !== null && x !== undefined; }
  /** A number with its sign, green above 0 and red below (advantages). */
  function signed(x) {
    return h("span", {class: x > 0 ? "pos" : x < 0 ? "neg" : ""}, known(x) ? (x > 0 ? "+" : "") + fmt(x) : "–");
  }
  function showTip(event, text) {
    tip.textContent = text;
    tip.style.display = "block";
    const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const below = event.clientY + 16 + tip.offsetHeight <= window.innerHeight;
    const y = below ? event.clientY + 16 : event.clientY - tip.offsetHeight - 10;
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() { tip.style.display = "none"; }
  /** Replace the page's content (nested arrays and empty parts allowed, as in h()). */
  function display(...parts) {
    main.replaceChildren(...parts.flat(Infinity).filter((p) => p !== null && p !== undefined && p !== false));
  }

  // ---- data: the page's server, or the data embedded in a saved file -----------------------
  function remoteApi(prefix) {
    async function get(url) {
      const response = await fetch(url, {cache: "no-store"});
      const body = await response.json().catch(() => ({error: response.statusText}));
      if (!response.ok) throw new Error(body.error || response.statusText);
      return body;
    }
    return {
      run: () => get(prefix + "run"),
      episodes: (q) => get(prefix + "episodes?" + new URLSearchParams(q)),
      episode: (id) => get(prefix + "episode/" + encodeURIComponent(id)),
      group: (key) => get(prefix + "group/" + encodeURIComponent(key)),
      tree: (key) => get(prefix + "tree/" + encodeURIComponent(key)),
      near: (id, count) => ({previous: id > 0 ? id - 1 : null, next: id + 1 < count ? id + 1 : null}),
    };
  }

  /** The same calls answered from a saved page's embedded data (filters as omrl.view.store.matches). */
  function localApi(data) {
    const missing = (what) => Promise.reject(new Error(what + " is not in this saved page (" + data.note + ")"));
    function matches(e, q) {
      if (q.env && e.env !== q.env) return false;
      if (q.split && e.split !== q.split) return false;
      if (q.task && String(e.task) !== q.task.trim()) return false;
      if (q.group && e.group !== q.group) return false;
      if ((q.success === "won" || q.success === "lost") && e.won !== (q.success === "won")) return false;
      if (q.end && e.end !== q.end) return false;
      if (q.file && String(e.file) !== q.file) return false;
      if (q.seat && e.seat !== q.seat) return false;
      if (q.outcome && e.outcome !== q.outcome) return false;
      const low = q.rmin === undefined || q.rmin === "" ? NaN : Number(q.rmin);
      const high = q.rmax === undefined || q.rmax === "" ? NaN : Number(q.rmax);
      if (!isNaN(low) && e.reward < low) return false;
      if (!isNaN(high) && e.reward > high) return false;
      return true;
    }
    return {
      run: () => Promise.resolve(data.run),
      episodes: (q) => {
        let items = data.summaries.filter((e) => matches(e, q));
        const key = (q.sort || "").replace(/^-/, "");
        if (["reward", "tokens", "turns", "score"].includes(key)) {
          const sign = q.sort.startsWith("-") ? -1 : 1;
          // an unknown value (a report's token counts) last either way, as the server lists them
          items = items.slice().sort((a, b) => !known(a[key]) || !known(b[key])
            ? Number(!known(a[key])) - Number(!known(b[key])) : sign * (a[key] - b[key]));
        }
        const offset = Math.max(0, parseInt(q.offset || "0", 10) || 0);
        const limit = Math.min(500, Math.max(1, parseInt(q.limit || "50", 10) || 50));
        const held = data.summaries.length;  // the episodes this page holds, maybe fewer than the run's
        return Promise.resolve({total: items.length, offset, limit, held, items: items.slice(offset, offset + limit)});
      },
      episode: (id) => data.details[id] ? Promise.resolve(data.details[id]) : missing("episode " + id),
      group: (key) => data.groups[key] ? Promise.resolve(data.groups[key]) : missing("group " + key),
      tree: (key) => data.trees[key] ? Promise.resolve(data.trees[key]) : missing("the tree of group " + key),
      near: (id) => {  // the episodes this page holds next to ``id`` (their ids sorted)
        const ids = data.summaries.map((e) => e.id);
        return {previous: ids.filter((x) => x < id).pop() ?? null, next: ids.find((x) => x > id) ?? null};
      },
    };
  }

  // ---- routing: #/overview, #/episodes?filters, #/episode/ID, #/group/KEY, #/tree/KEY --------
  // comparing two evals: #/compare, and each side's views under #/a/... and #/b/...
  function route() {
    let hash = location.hash.replace(/^#\/?/, "") || (comparison ? "compare" : "overview");
    let where = "";
    const onSide = comparison ? hash.match(/^([ab])(?:\/(.*))?$/) : null;
    if (onSide) [where, hash] = [onSide[1], onSide[2] || "overview"];
    const [path, query] = hash.split("?");
    const [view, ...rest] = path.split("/");
    const arg = decodeURIComponent(rest.join("/"));
    const params = Object.fromEntries(new URLSearchParams(query || ""));
    const tab = (where ? where + "/" : "") + (["episode", "group", "tree"].includes(view) ? "episodes" : view);
    for (const a of document.querySelectorAll("header.top nav a")) a.classList.toggle("active", a.dataset.view === tab);
    hideTip();
    const views = {overview: showOverview, episodes: showEpisodes, episode: showEpisode, group: showGroup, tree: showTree};
    const show = comparison && !where ? showCompare : views[view] || showOverview;
    const shown = enter(where).then(() => {
      display(problemsBox(), h("p", {class: "muted"}, "loading…"));
      return show(arg, params);
    });
    shown.catch((err) => {
      display(problemsBox(), h("div", {class: "card problems"}, h("strong", {}, "Could not show this: "), err.message));
    });
  }

  /** Make ``where`` (a comparison's side "a" or "b", or "" for the comparison or the only run) the run
   * shown, reading its overview the first time. */
  async function enter(where) {
    side = where;
    if (!where) {
      api = home;
      if (comparison) run = comparison;
      return;
    }
    const other = sides[where];
    if (!other.run) other.run = await other.api.run();
    api = other.api;
    run = other.run;
  }

  function problemsBox() {
    const box = document.createDocumentFragment();
    if (!run) return box;
    if (side) {
      const about = comparison.sides[side];
      box.appendChild(h("div", {class: "card note side", "data-side": side},
        h("strong", {}, side.toUpperCase() + ": " + about.name), " ", h("code", {}, about.path), " · ",
        h("a", {href: "#/compare"}, "← the comparison")));
    }
    if (run.embedded_note) box.appendChild(h("div", {class: "card note"}, run.embedded_note));
    const errors = run.problems.filter((p) => p.level === "error");
    const warnings = run.problems.filter((p) => p.level !== "error");
    const kinds = [[errors, "problems", "Could not be shown"], [warnings, "problems warnings", "Shown with caveats"]];
    for (const [list, cls, title] of kinds) {
      if (!list.length) continue;
      box.appendChild(h("div", {class: "card " + cls, "data-problems": cls},
        h("strong", {}, title + ":"),
        h("ul", {}, list.map((p) => h("li", {}, h("code", {}, p.file), ": ", p.message)))));
    }
    return box;
  }

  // ---- overview: what the run is, its curves, its eval reports, its config -----------------
  async function showOverview() {
    const body = [problemsBox()];
    body.push(h("div", {class: "card"},
      h("div", {}, h("strong", {}, run.kind === "run" ? "Run " : "File "), h("code", {}, run.path)),
      h("div", {class: "muted"},
        run.episodes + " episodes in " + run.files.length + " trajectory file(s); " + run.tokenizer),
      // a training rollout's advantages: as recorded, or "not recorded" for one saved before omrl kept them
      run.facets.trained || run.facets.unrecorded ? h("div", {class: "muted", "data-advantage": ""}, run.advantage) : null,
      run.files.length ? h("ul", {}, run.files.map((f, i) =>
        h("li", {}, h("a", {href: at("episodes?file=" + i)}, f.file), " — " + f.episodes + " episodes"))) : null,
      run.envs.length > 1 ? h("div", {class: "envs"}, "Envs: ", run.envs.map((e, i) => [i ? " · " : null,
        h("a", {href: at("episodes?" + new URLSearchParams({env: e.env}))}, e.env), " (" + e.episodes + ")"])) : null));
    body.push(h("h2", {}, "Learning curves"));
    if (run.metrics.step.length) {
      body.push(h("div", {class: "plots"}, run.panels.map((p) => plot(p, run.metrics))));
      if (run.env_panels.length) body.push(h("h2", {}, "By env"), byEnv(run.env_panels, run.metrics));
    } else {
      body.push(h("p", {class: "muted"}, "No metrics.jsonl steps to plot."));
    }
    if (run.stages) body.push(h("h2", {}, "Stages"), stagesTable(run.stages));
    for (const report of run.reports) {
      body.push(h("h2", {}, "Evaluation: ", h("code", {}, report.file)), metricsTable(report.metrics));
      if (Object.keys(report.per_env || {}).length) body.push(h("h3", {}, "By env"), envTable(report));
    }
    if (run.tasks) body.push(h("h2", {}, "Per task"), taskTable(run.tasks));
    if (run.config) body.push(h("h2", {}, "Config"), h("pre", {class: "config"}, run.config));
    display(...body);
  }

  /** The supervisor's latest heartbeat: each stage's count, time and stalls, then the stages open when it was written. */
  function stagesTable(beat) {
    const when = typeof beat.time === "number" ? new Date(beat.time * 1000).toLocaleString() : "?";
    const rows = Object.entries(beat.stages).map(([name, s]) =>
      h("tr", {}, h("td", {}, name), h("td", {class: "num"}, fmt(s.done, 4)), h("td", {class: "num"}, fmt(s.seconds, 4)),
        h("td", {class: "num"}, fmt(s.stalled, 4))));
    const open = (beat.open || []).map((o) => h("li", {class: o.stalled ? "stalled" : ""},
      o.stage + " for " + fmt(o.for_s, 3) + " s" + (o.env ? ", env " + o.env : "") + (o.episode ? ", " + o.episode : "") +
      (o.stalled ? " (past its deadline)" : "")));
    return h("div", {class: "card", "data-stages": ""},
      h("div", {class: "muted"}, "heartbeat of step " + beat.step + " at " + when),
      h("table", {}, h("tr", {}, ["stage", "done", "seconds", "stalled"].map((c) => h("th", {}, c))), rows),
      open.length ? [h("div", {}, "Open then:"), h("ul", {}, open)] : h("div", {class: "muted"}, "No stage was open then."));
  }

  function metricsTable(metrics) {
    const rows = [];
    for (const [key, value] of Object.entries(metrics)) {
      if (value !== null && typeof value === "object") {
        for (const [sub, v] of Object.entries(value)) rows.push([key + ": " + sub, v]);
      } else rows.push([key, value]);
    }
    return keyValues(rows);
  }

  /** A run over several envs: one metric's overall curve and a line per env, the metric chosen in a list. */
  function byEnv(panels, metrics) {
    const first = panels.find((p) => p.metric === "success") || panels[0];
    const slot = h("div", {class: "plots"}, plot(first, metrics));
    const choose = (event) => {
      slot.replaceChildren(plot(panels.find((p) => p.metric === event.target.value), metrics));
    };
    return h("div", {class: "by-env"},
      h("form", {class: "filters card", onsubmit: (e) => e.preventDefault()},
        h("label", {}, "metric (its overall curve and one line per env)",
          h("select", {name: "env-metric", onchange: choose},
            panels.map((p) => h("option", {value: p.metric, selected: p === first}, p.metric))))),
      slot);
  }

  /** A mixture's eval report by env: a row per metric, a column per env, then macro (the mean of the
   * envs' values) and micro (over every episode). */
  function envTable(report) {
    const envs = Object.keys(report.per_env);
    const columns = [...envs.map((e) => [e, report.per_env[e]]), ["macro", report.macro], ["micro", report.micro]];
    const keys = [...new Set(envs.flatMap((e) => Object.keys(report.per_env[e])))]
      .filter((k) => envs.some((e) => typeof report.per_env[e][k] === "number"));
    return h("table", {class: "card env-report"},
      h("thead", {}, h("tr", {}, h("th", {}, "metric"), columns.map(([name]) => h("th", {class: "num"}, name)))),
      h("tbody", {}, keys.map((k) => h("tr", {}, h("td", {}, k),
        columns.map(([, metrics]) => h("td", {class: "num"}, fmt((metrics || {})[k], 4)))))));
  }

  /** Each task's samples, wins and pass@k (an eval's or a rollout's with several samples a task), a row
   * per task linking to its samples side by side. */
  function taskTable(tasks) {
    const files = run.files.length > 1, envs = run.facets.env.length > 1;
    const head = ["task", files ? "file" : null, envs ? "env" : null, "samples", "won",
      ...tasks.ks.map((k) => "pass@" + k), "mean reward"].filter((c) => c !== null);
    const link = (t) => t.group !== null ? at("group/" + encodeURIComponent(t.group))
      : at("episodes?" + new URLSearchParams({task: String(t.task), file: String(t.file)}));
    const rows = tasks.rows.map((t) => {
      const byK = Object.fromEntries(t.pass.map((p) => [p.k, p.value]));
      return h("tr", {"data-task": t.task},
        h("td", {}, h("a", {href: link(t)}, fmt(t.task))),
        files ? h("td", {}, run.facets.file[t.file]) : null,
        envs ? h("td", {class: "env"}, t.env) : null,
        h("td", {class: "num"}, String(t.n) + (t.env_errors ? " (+" + t.env_errors + " env error)" : "")),
        h("td", {class: "num"}, String(t.won)),
        tasks.ks.map((k) => h("td", {class: "num", "data-k": k}, fmt(byK[k], 3))),
        h("td", {class: "num"}, fmt(t.mean_reward, 3)));
    });
    return h("div", {class: "card", "data-tasks": ""},
      h("p", {class: "muted"}, "pass@k per task: the unbiased estimator over its samples (env errors left out), " +
        "as the eval report averages it" + (tasks.rows.length < tasks.tasks
          ? "; the first " + tasks.rows.length + " of " + tasks.tasks + " tasks" : "") + ". A task opens its samples side by side."),
      h("table", {class: "tasks"}, h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))), h("tbody", {}, rows)));
  }

  /** A two-column table of [name, number] rows. */
  function keyValues(rows) {
    return h("table", {class: "card"},
      h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {class: "num"}, fmt(v, 4))))));
  }

  /** One learning-curve panel as inline SVG: a line per metric (broken where a step lacks it or logged
   * NaN or ±inf, which reach the page as null), named in the legend by the panel's labels where it has
   * them (a by-env panel's: the envs). A panel with nothing to draw, or that fails to draw, says so in
   * its own figure, and the rest of the page is shown. */
  function plot(panel, metrics) {
    try {
      return drawPlot(panel, metrics);
    } catch (err) {
      console.error("omrl view: could not draw the chart " + JSON.stringify(panel.title), err);
      return plotFigure(panel, metrics, h("p", {class: "plot-note"}, "Could not draw this chart: " + err.message));
    }
  }

  /** A number a curve can place: finite (non-finite values reach the page as null). */
  function drawable(v) { return typeof v === "number" && Number.isFinite(v); }

  /** The steps at which ``key`` has a value to draw. */
  function drawnSteps(metrics, key) {
    return (metrics.series[key] || []).flatMap((v, j) => drawable(v) && drawable(metrics.step[j]) ? [j] : []);
  }

  /** The panel's figure: its title, ``body`` (the chart or a note), and a legend that names the keys
   * with no value to draw. */
  function plotFigure(panel, metrics, body) {
    const label = (i) => (panel.labels || panel.keys)[i];
    return h("figure", {class: "plot", "data-panel": panel.name}, h("figcaption", {}, panel.title), body,
      h("div", {class: "legend"}, panel.keys.map((k, i) => {
        const empty = !drawnSteps(metrics, k).length;
        return h("span", {"data-key": k, class: empty ? "empty" : null},
          h("i", {class: k === panel.metric ? "overall" : null, style: "background:" + PALETTE[i % PALETTE.length]}),
          label(i), empty ? " (no finite value)" : null);
      })));
  }

  function drawPlot(panel, metrics) {
    const label = (i) => (panel.labels || panel.keys)[i];
    const steps = metrics.step;
    const drawn = panel.keys.map((k) => drawnSteps(metrics, k));
    if (!drawn.some((js) => js.length)) {
      return plotFigure(panel, metrics, h("p", {class: "plot-note"},
        "Nothing to draw: every logged value of this chart is NaN or ±inf."));
    }
    const [y0, y1] = extent(panel.keys.flatMap((k, i) => drawn[i].map((j) => metrics.series[k][j])));
    // every chart spans the run's steps, so that charts side by side line up
    let x0 = steps.reduce((a, x) => drawable(x) ? Math.min(a, x) : a, Infinity);
    let x1 = steps.reduce((a, x) => drawable(x) ? Math.max(a, x) : a, -Infinity);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    const yTicks = ticks(y0, y1, 5), yLabels = tickLabels(yTicks);
    // room on the left for the longest label (10.5px text is about 6px a character)
    const W = 420, H = 220, R = 12, T = 10, B = 28;
    const L = Math.max(52, 10 + 6 * Math.max(...yLabels.map((t) => t.length)));
    // in halves, so that a range wider than the largest double (-1e308 to 1e308) does not overflow
    const X = (x) => L + (x / 2 - x0 / 2) / (x1 / 2 - x0 / 2) * (W - L - R);
    const Y = (y) => T + (1 - (y / 2 - y0 / 2) / (y1 / 2 - y0 / 2)) * (H - T - B);
    const chart = s("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": panel.title});
    yTicks.forEach((t, i) => {
      chart.append(s("line", {class: "grid", x1: L, x2: W - R, y1: Y(t), y2: Y(t)}),
        s("text", {class: "tick-y", x: L - 6, y: Y(t) + 3.5, "text-anchor": "end"}, yLabels[i]));
    });
    for (const t of ticks(x0, x1, 6).filter((t) => Number.isInteger(t))) {
      chart.append(s("text", {class: "tick-x", x: X(t), y: H - B + 14, "text-anchor": "middle"}, String(t)));
    }
    chart.append(s("line", {class: "axis", x1: L, x2: L, y1: T, y2: H - B}),
      s("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}),
      s("text", {x: W - R, y: H - 3, "text-anchor": "end"}, "step"));
    panel.keys.forEach((key, i) => {
      const color = PALETTE[i % PALETTE.length];
      let d = "", last = -2;
      for (const j of drawn[i]) {
        const v = metrics.series[key][j];
        d += `${j === last + 1 ? "L" : "M"}${X(steps[j]).toFixed(1)},${Y(v).toFixed(1)}`;
        last = j;
        if (steps.length <= 40) chart.append(s("circle", {cx: X(steps[j]), cy: Y(v), r: 2.4, fill: color}));
      }
      const overall = key === panel.metric;  // a by-env panel's overall curve, dashed
      if (d) chart.append(s("path", {class: "series" + (overall ? " overall" : ""), d, stroke: color, "data-key": key}));
    });
    const cursor = s("line", {class: "cursor", y1: T, y2: H - B, visibility: "hidden"});
    const hit = s("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "transparent"});
    hit.addEventListener("mousemove", (event) => {
      const box = chart.getBoundingClientRect();
      const x = x0 + ((event.clientX - box.left) * W / box.width - L) / (W - L - R) * (x1 - x0);
      let j = -1;
      steps.forEach((step, k) => {
        if (drawable(step) && (j < 0 || Math.abs(step - x) < Math.abs(steps[j] - x))) j = k;
      });
      cursor.setAttribute("x1", X(steps[j])); cursor.setAttribute("x2", X(steps[j]));
      cursor.setAttribute("visibility", "visible");
      const values = panel.keys.map((k, i) => label(i) + "  " + fmt(metrics.series[k][j], 4));
      showTip(event, "step " + steps[j] + "\n" + values.join("\n"));
    });
    hit.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); hideTip(); });
    chart.append(cursor, hit);
    return plotFigure(panel, metrics, chart);
  }

  /** The [low, high] an axis spans for these finite values (at least one). A spread below a
   * billionth of their size (a ratio of 1 logged as 0.9999999999999998, float noise) is no spread:
   * such values, like a constant, get an axis 10% either side of their middle. */
  function extent(values) {
    // reduce, not Math.min(...values): a long run has more values than a call may take arguments
    const lo = values.reduce((a, b) => Math.min(a, b), Infinity);
    const hi = values.reduce((a, b) => Math.max(a, b), -Infinity);
    const size = Math.max(Math.abs(lo), Math.abs(hi));
    if (hi - lo > size * 1e-9) return [lo, hi];
    const middle = lo / 2 + hi / 2;
    const pad = Math.abs(middle) * 0.1 || 1;
    const limit = (x) => Math.max(-Number.MAX_VALUE, Math.min(Number.MAX_VALUE, x));  // 1e308 + 10% is no number
    return [limit(middle - pad), limit(middle + pad)];
  }

  /** Round numbers spanning [lo, hi]: a step of 1, 2 or 5 times a power of ten, about (hi - lo) / count
   * and never below a few units of the values' own resolution, so that no two ticks are the same
   * number and there are at most count + 1 of them (the two ends where no such step exists). The ticks
   * are counted by an integer, never by adding the step to a float until it passes hi. */
  function ticks(lo, hi, count) {
    if (!drawable(lo) || !drawable(hi) || hi < lo) return [];
    if (hi === lo) return [lo];
    const resolution = 4 * Number.EPSILON * Math.max(Math.abs(lo), Math.abs(hi));
    const raw = Math.max((hi / 2 - lo / 2) / count * 2, resolution);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((st) => st >= raw) || raw;
    const first = Math.ceil(lo / step - 1e-9), last = Math.floor(hi / step + 1e-9);  // 0.0001 / 0.0001 > 1
    if (!(last - first >= 1 && last - first <= count)) return [lo, hi];
    const out = [];
    for (let i = first; i <= last; i++) out.push(i * step);
    return out;
  }

  /** The labels of a chart's y ticks, with as many digits as their spacing needs (0.8445 and 0.8450
   * must not both read 0.845); in exponent form for large numbers, and for small ones that would need
   * more than 8 decimals. */
  function tickLabels(values) {
    const gap = values.length > 1 ? values[1] - values[0] : 0;
    const top = values.reduce((a, v) => Math.max(a, Math.abs(v)), 0);
    const decimals = gap > 0 ? Math.max(0, Math.ceil(-Math.log10(gap) - 1e-9)) : 3;
    if (top < 1e5 && (decimals <= 8 || top >= 1)) return values.map((t) => t.toFixed(decimals));
    const digits = gap > 0 ? Math.min(10, Math.max(1, Math.floor(Math.log10(top)) - Math.floor(Math.log10(gap)))) : 1;
    return values.map((t) => t === 0 ? "0" : t.toExponential(digits));
  }

  // ---- the episode list: filters, sort, pages ---------------------------------------------
  async function showEpisodes(_arg, params) {
    const q = Object.assign({offset: "0", limit: "50"}, params);
    const page = await api.episodes(q);
    const set = (changes) => {
      location.hash = at("episodes?" + new URLSearchParams(clean(Object.assign({}, q, {offset: "0"}, changes))));
    };
    const f = run.facets;
    const select = (name, options, label) => h("label", {}, label,
      h("select", {name, onchange: (e) => set({[name]: e.target.value})},
        options.map(([value, text]) => h("option", {value, selected: (q[name] || "") === value}, text))));
    const input = (name, label, type) => h("label", {}, label,
      h("input", {name, class: "short", type: type || "text", value: q[name] || "", step: "any",
        onchange: (e) => set({[name]: e.target.value})}));
    const all = (values) => [["", "all"], ...values.map((x) => [x, x])];
    const envs = f.env.length > 1;  // a run over several envs: filter and show by env
    const seats = (f.seat || []).length > 0;  // games of several seats: filter and show by seat and outcome
    const form = h("form", {class: "filters card", onsubmit: (e) => e.preventDefault()},
      envs ? select("env", all(f.env), "env") : null,
      select("split", all(f.split), "split"),
      input("task", "task"),
      input("group", "group"),
      select("success", all(["won", "lost"]), "success"),
      select("end", all(f.end), "end reason"),
      f.file.length > 1 ? select("file", [["", "all"], ...f.file.map((x, i) => [String(i), x])], "file") : null,
      seats ? select("seat", all(f.seat), "seat") : null,
      seats ? select("outcome", all(f.outcome), "outcome") : null,
      input("rmin", "reward ≥", "number"),
      input("rmax", "reward ≤", "number"),
      select("sort", [["", "file order"], ["-reward", "reward, high first"], ["reward", "reward, low first"],
        ["-tokens", "length, longest first"], ["tokens", "length, shortest first"], ["-turns", "turns, most first"]],
      "sort"),
      h("button", {type: "button", onclick: () => { location.hash = at("episodes"); }}, "clear"));
    const offset = page.offset;
    const filtered = Object.keys(clean(q)).some((k) => !["sort", "offset", "limit"].includes(k));
    const partial = known(page.held) && page.held < run.episodes;  // a saved page holding some of the run's
    const count = !filtered ? (partial ? page.total + " of the run's " + run.episodes + " episodes (those this saved page holds)"
      : page.total + " episodes")
      : partial ? page.total + " of the " + page.held + " episodes this saved page holds match (the run has " + run.episodes + ")"
      : page.total + " of " + run.episodes + " episodes match";
    const pager = h("div", {class: "pager"},
      h("span", {class: "count", "data-total": page.total}, count),
      page.total ? h("span", {class: "muted"}, "showing " + (offset + 1) + "–" + (offset + page.items.length)) : null,
      h("button", {type: "button", disabled: offset === 0,
        onclick: () => set({offset: String(Math.max(0, offset - page.limit))})}, "← previous"),
      h("button", {type: "button", disabled: offset + page.limit >= page.total,
        onclick: () => set({offset: String(offset + page.limit)})}, "next →"));
    const multi = f.file.length > 1;
    // advantages and trained tokens only where the trainer recorded its update: an eval's episodes were never trained on
    const trained = f.trained;
    const columns = ["#", multi ? "file" : null, envs ? "env" : null, "split", "task", "group", "sample",
      seats ? "seat" : null, seats ? "played by" : null, seats ? "outcome" : null, "success", "reward",
      trained ? "advantage" : null, "score", "end", "turns", "tokens", trained ? "trained" : "generated"];
    const num = (x) => h("td", {class: "num"}, x);
    const row = (e) => h("tr", {"data-id": e.id, onclick: () => { location.hash = at("episode/" + e.id); }},
      num(h("a", {href: at("episode/" + e.id)}, String(e.id))),
      multi ? h("td", {}, f.file[e.file]) : null,
      envs ? h("td", {class: "env"}, e.env) : null,
      h("td", {}, e.split), num(fmt(e.task)),
      h("td", {}, h("a", {href: at("group/" + encodeURIComponent(e.group)), onclick: (ev) => ev.stopPropagation()},
        e.group)),
      num(String(e.sample)),
      seats ? h("td", {class: "seat"}, e.seat || "") : null,
      seats ? h("td", {}, e.player || "") : null,
      seats ? h("td", {class: "outcome " + outcomeClass(e.outcome)}, e.outcome || "") : null,
      h("td", {class: e.won ? "won" : "lost"}, e.won ? "won" : "lost"),
      num(fmt(e.reward)), trained ? num(e.trained ? signed(e.advantage) : "") : null, num(fmt(e.score)),
      h("td", {}, e.end, e.error ? h("span", {class: "badge bad", title: e.error}, "error") : null),
      num(String(e.turns)), num(fmt(e.tokens)), num(fmt(e.generated)));  // "–": unknown (a report's)
    const table = h("table", {class: "list card"},
      h("thead", {}, h("tr", {}, columns.filter((c) => c !== null).map((c) => h("th", {}, c)))),
      h("tbody", {}, page.items.map(row)));
    display(problemsBox(), form, pager,
      page.items.length ? table : h("p", {class: "muted"}, "No episode matches these filters."));
  }

  /** The query without empty filters and defaults, so the address stays short. */
  function clean(q) {
    const defaults = {offset: "0", limit: "50"};
    return Object.fromEntries(Object.entries(q).filter(([k, v]) => v !== "" && v !== undefined && defaults[k] !== v));
  }

  // ---- one episode: its turns, then every token ------------------------------------------
  async function showEpisode(id) {
    const ep = await api.episode(id);
    const e = ep.summary;
    const near = api.near(Number(id), run.episodes);
    const links = h("p", {},
      h("a", {href: at("episodes")}, "← all episodes"), " · ",
      h("a", {href: at("group/" + encodeURIComponent(e.group))}, "its group (" + e.group + ")"),
      e.tree ? [" · ", h("a", {href: at("tree/" + encodeURIComponent(e.group))}, "its search tree")] : null,
      known(near.previous) ? [" · ", h("a", {href: at("episode/" + near.previous)}, "previous")] : null,
      known(near.next) ? [" · ", h("a", {href: at("episode/" + near.next)}, "next")] : null);
    const facts = h("table", {class: "card facts"}, h("tbody", {},
      [["file", run.facets.file[e.file] + " (row " + e.row + ")"], ["env", e.env], ["split", e.split], ["task", fmt(e.task)],
        ["group / sample", e.group + " / " + e.sample],
        known(e.seat) ? ["seat", e.seat + " (played by " + e.player + ")"] : null,
        known(e.seat) ? ["outcome", h("span", {class: outcomeClass(e.outcome)}, e.outcome + " against " + e.opponent)] : null,
        ["success", e.won ? "won" : "lost"],
        known(ep.expected) ? ["final answer", answerFact(ep)] : null,
        ["total reward", fmt(e.reward, 4)], e.trained ? ["advantage", fmt(e.advantage, 4)] : null, ["score", fmt(e.score, 4)],
        ["end reason", e.end], ["turns", e.turns],
        [e.trained ? "tokens (trained)" : "tokens (generated)", fmt(e.tokens) + " (" + fmt(e.generated) + ")"],
        ...(ep.unavailable ? [] : playFacts(ep))]  // an unavailable episode comes without its turns
        .filter((fact) => fact !== null)
        .map(([k, v]) => h("tr", {"data-fact": k}, h("th", {}, k), h("td", {}, v)))));
    const body = [problemsBox(), links, h("h2", {}, "Episode " + id), facts];
    if (e.error) body.push(h("div", {class: "card problems"}, h("strong", {}, "error: "), e.error));
    if (ep.unavailable) {
      body.push(h("div", {class: "card problems"}, ep.unavailable));
      display(...body);
      return;
    }
    const totals = Object.entries(ep.reward_totals || {});
    if (totals.length) {
      body.push(h("h3", {}, "Reward by component (summed over turns)"),
        keyValues(totals));
    }
    body.push(h("h3", {}, "Task"), h("pre", {class: "instruction"}, ep.instruction));
    if (ep.game) body.push(gameView(ep.game, Number(id)));
    const last = ep.turns.length - 1;
    const turns = ep.turns.map((t, i) => [i && t.row !== ep.turns[i - 1].row ? rowDivider(ep, t.row) : null,
      turnView(t, i, i === last ? ep.expected : null)]);
    body.push(h("h2", {}, ep.game ? "This seat's turns (" + e.seat + ")" : "Turns"),
      ep.turns.length ? turns : h("p", {class: "muted"}, "No model turn."));
    body.push(h("h2", {}, "Tokens"), tokenView(ep));
    display(...body);
  }

  /** The parsed final answer (the last turn's action) and, beside it, the answer the env expected. */
  function answerFact(ep) {
    return [h("code", {class: "final-answer"}, known(ep.final_answer) ? ep.final_answer : "(none parsed)"), " · ",
      h("span", {class: "expected"}, expectedText(ep.expected))];
  }

  /** "expected: X", or for several accepted answers "expected (any of): X | Y". */
  function expectedText(expected) {
    return Array.isArray(expected) ? "expected (any of): " + expected.join(" | ") : "expected: " + expected;
  }

  /** The summary's rows about how the episode was played: its rows (whenever it has several, and for an
   * agent's episode always), its tool-call attempts by status, what the agent returned and how it scored. */
  function playFacts(ep) {
    const rows = (ep.row_starts || []).length + 1;
    const last = ep.turns[ep.turns.length - 1] || {};
    const facts = [];
    if (rows > 1 || ep.played_by_agent) facts.push(["rows", rows + " — " + rowsNote(ep, rows)]);
    const statuses = Object.entries(ep.tool_calls || {});
    if (statuses.length) facts.push(["tool calls", statuses.map(([status, n]) => statusBadge(status, status + " × " + n))]);
    if (known(last.agent_result)) facts.push(["agent returned", h("code", {class: "agent-result"}, last.agent_result)]);
    if (last.agent_reward) facts.push(["agent reward", componentBadges(last.agent_reward)]);
    return facts;
  }

  function rowsNote(ep, rows) {
    if (!ep.played_by_agent) return "a new row starts where the template rewrote earlier turns (chat.history=as_template)";
    if (rows === 1) return "every call of the agent continued the same prompt";
    return "a new row starts where the agent sent a prompt that did not continue the last row's " +
      "(or the template rewrote earlier turns); each row is trained as its own sequence";
  }

  /** The line that opens row ``row`` (0-based) of the episode, in the turn list and among the tokens. */
  function rowDivider(ep, row) {
    const why = ep.played_by_agent ? "the agent's request did not continue the last row: a whole new prompt"
      : "the template rewrote earlier turns: a whole new prompt (chat.history=as_template)";
    return h("div", {class: "row-break", "data-row": row + 1, title: why}, "row " + (row + 1) + " (new prompt)");
  }

  /** A tool-call status as a badge: ok green, every other status (a malformed or refused call) red. */
  function statusBadge(status, text) {
    return h("span", {class: "badge " + (status === "ok" ? "good" : "bad"), "data-status": status}, text);
  }

  function componentBadges(components) {
    return Object.entries(components).map(([k, v]) => h("span", {class: "badge", "data-component": k}, k + " " + fmt(v, 4)));
  }

  /** Each <tool_call> attempt of a reply: its status, the tool it named, and why it failed. */
  function toolCallsView(calls) {
    return [h("div", {class: "label"}, "tool calls"),
      h("ul", {class: "tool-calls"}, calls.map((c) =>
        h("li", {class: "tool-call" + (c.status === "ok" ? "" : " bad"), "data-status": c.status},
          statusBadge(c.status, c.status), h("code", {}, known(c.name) ? c.name : "(no name)"),
          known(c.error) ? h("span", {class: "error"}, " " + c.error) : null)))];
  }

  function turnView(t, i, expected) {
    const rewards = Object.entries(t.rewards || {});
    const calls = t.tool_calls || [];
    const failed = calls.filter((c) => c.status !== "ok").length;
    return h("div", {class: "turn" + (failed ? " failed-calls" : ""), "data-turn": i},
      h("div", {}, h("strong", {}, "Turn " + (i + 1)), " ",
        h("span", {class: "badge " + (t.format_ok ? "good" : "bad")}, t.format_ok ? "format ok" : "format error"),
        t.done ? h("span", {class: "badge"}, "done") : null,
        known(t.node) && t.node >= 0 ? h("span", {class: "badge"}, "node " + t.node + " ← " + t.parent) : null,
        failed ? h("span", {class: "badge bad"}, failed + " of " + calls.length + " tool call(s) failed") : null,
        h("span", {class: "muted"}, " step reward " + fmt(t.reward, 4))),
      h("div", {class: "label"}, "observation"), h("pre", {class: "observation"}, t.observation),
      h("div", {class: "label"}, "response"), h("pre", {class: "response"}, t.response),
      calls.length ? toolCallsView(calls) : null,
      h("div", {class: "label"}, "action"), h("pre", {class: "action"}, t.action === null ? "(none parsed)" : t.action),
      known(expected) ? h("div", {class: "expected"}, expectedText(expected)) : null,
      t.parse_error ? [h("div", {class: "label"}, "parse error"), h("pre", {class: "error"}, t.parse_error)] : null,
      known(t.agent_result)
        ? [h("div", {class: "label"}, "agent returned"), h("pre", {class: "agent-result"}, t.agent_result)] : null,
      t.agent_reward ? [h("div", {class: "label"}, "agent reward (the reward function's components)"),
        h("div", {class: "agent-reward"}, componentBadges(t.agent_reward))] : null,
      rewards.length ? [h("div", {class: "label"}, "reward breakdown"),
        h("div", {}, rewards.map(([k, v]) => h("span", {class: "badge"}, k + " " + fmt(v, 4))))] : null,
      Object.keys(t.info || {}).length
        ? h("details", {}, h("summary", {class: "muted"}, "info"), h("pre", {}, JSON.stringify(t.info, null, 2))) : null);
  }

  /** Every token of the episode, trained ones (loss mask 1) marked; details on hover. */
  function tokenView(ep) {
    const tk = ep.tokens;
    if (!tk.ids.length) {
      return h("p", {class: "muted"}, "This file keeps no token ids (readable JSONL records); " +
        "view the trajectory parquet for tokens.");
    }
    const perToken = Array.isArray(tk.advantage);
    const sampled = ep.summary.trained ? "trained" : "generated";  // an eval's tokens were never trained on
    const box = h("div", {class: "tokens mono" + (tk.text ? "" : " ids")});
    const frag = document.createDocumentFragment();
    const rowAt = new Map((ep.row_starts || []).map((start, k) => [start, k + 1]));
    tk.ids.forEach((id, i) => {
      // the episode's next row: a whole new prompt, trained packed beside the others
      if (rowAt.has(i)) frag.appendChild(rowDivider(ep, rowAt.get(i)));
      const span = document.createElement("span");
      span.className = "tok " + (tk.mask[i] ? "trained" : "context");
      span.dataset.i = i;
      span.textContent = tk.text ? tk.text[i] : String(id);
      frag.appendChild(span);
      if (!tk.text) frag.appendChild(document.createTextNode(" "));
    });
    box.appendChild(frag);
    box.addEventListener("mousemove", (event) => {
      const i = event.target.dataset && event.target.dataset.i;
      if (i === undefined) { hideTip(); return; }
      const k = Number(i);
      const adv = perToken ? tk.advantage[k] : tk.mask[k] ? tk.advantage : null;
      const lines = ["token " + k + "  id " + tk.ids[k] + (tk.text ? "  " + JSON.stringify(tk.text[k]) : ""),
        tk.mask[k] ? sampled + " (loss mask 1)" : "context (loss mask 0)"];
      if (tk.mask[k]) lines.push("log-prob  " + fmt(tk.logprob[k], 4));
      if (adv !== null && adv !== undefined) lines.push("advantage " + fmt(adv, 4));
      if (tk.return && known(tk.return[k])) lines.push("return    " + fmt(tk.return[k], 4));
      if (tk.value && known(tk.value[k])) lines.push("value     " + fmt(tk.value[k], 4));
      showTip(event, lines.join("\n"));
    });
    box.addEventListener("mouseleave", hideTip);
    return h("div", {},
      h("p", {class: "legend"},
        h("span", {class: "swatch", style: "background:var(--trained)"}), sampled + " (loss mask 1, sampled by the model)",
        h("span", {class: "swatch", style: "background:var(--context)"}), "context (prompt, observations, template)",
        h("span", {class: "muted"}, " · hover a token for its log-prob" +
          (known(tk.advantage) ? " and advantage (" + tk.advantage_note + ")" : ""))),
      ep.left_out ? h("p", {class: "muted", "data-left-out": ""}, ep.left_out) : null,
      tk.text ? null : h("p", {class: "muted"}, run.tokenizer),
      tk.cut ? h("p", {class: "muted cut"}, tk.cut) : null,
      box);
  }

  // ---- a group: the samples of one task side by side --------------------------------------
  async function showGroup(key) {
    const g = await api.group(key);
    const first = g.members[0] ? g.members[0].summary : null;
    const columns = g.members.map((m) => {
      const e = m.summary;
      const components = Object.fromEntries(Object.entries(m.rewards || {}).filter(([name]) => name !== "total"));
      return h("div", {class: "card member", "data-id": e.id},
        h("div", {}, h("a", {href: at("episode/" + e.id)}, "episode " + e.id), " · sample " + e.sample),
        h("div", {class: e.won ? "won" : "lost"}, e.won ? "won" : "lost", h("span", {class: "muted"}, " · " + e.end)),
        h("div", {}, "reward " + fmt(e.reward, 4), e.trained ? [" · advantage ", signed(e.advantage)] : null),
        Object.keys(components).length ? h("div", {class: "components"}, componentBadges(components)) : null,
        m.unavailable ? h("p", {class: "error"}, m.unavailable) : null,
        m.turns.map((t, i) => h("div", {class: "turn"},
          h("div", {class: "label"},
            "turn " + (i + 1) + " · reward " + fmt(t.reward, 4) + (t.format_ok ? "" : " · format error")),
          h("pre", {}, t.action === null ? t.response : "Act: " + t.action))));
    });
    display(problemsBox(),
      h("p", {}, h("a", {href: at("episodes?group=" + encodeURIComponent(key))}, "← this group in the list")),
      h("h2", {}, "Group " + key + (first ? " · task " + fmt(first.task) + " (" + first.split + ")" : "")),
      h("p", {class: "muted"},
        g.size + " samples" + (g.shown < g.size ? ", the first " + g.shown + " shown" : "") + "." +
        (known(g.advantage) ? " " + g.advantage : "")),
      g.passes && g.passes.n > 1 ? passesView(g.passes) : null,
      known(g.expected) ? h("p", {class: "expected"}, expectedText(g.expected)) : null,
      first && g.members[0].instruction ? h("pre", {}, g.members[0].instruction) : null,
      h("div", {class: "columns"}, columns));
  }

  /** A group's wins and its pass@k for every k from 1 to its number of samples. */
  function passesView(p) {
    return h("div", {class: "card passes", "data-passes": ""},
      h("div", {}, "won " + p.won + " of " + p.n + " samples" +
        (p.env_errors ? " (" + p.env_errors + " env error(s) left out)" : "") + " · pass@k, the unbiased estimator:"),
      h("div", {}, p.pass.map((x) => h("span", {class: "badge", "data-k": x.k}, "pass@" + x.k + " " + fmt(x.value, 3)))));
  }

  // ---- two evals compared -----------------------------------------------------------------
  /** The header's links when comparing: the comparison, then each side's overview and episodes. */
  function compareNav() {
    const nav = document.querySelector("header.top nav");
    const links = [["compare", "Compare"]];
    for (const name of ["a", "b"]) {
      links.push([name + "/overview", name.toUpperCase() + " overview"], [name + "/episodes", name.toUpperCase() + " episodes"]);
    }
    nav.replaceChildren(...links.map(([view, text]) => h("a", {href: "#/" + view, "data-view": view,
      title: view === "compare" ? null : comparison.sides[view[0]].name}, text)));
  }

  /** Both evals' metrics with the difference, and per task the episodes whose outcome changed. */
  async function showCompare() {
    const c = comparison;
    const name = (x) => x.toUpperCase() + " (" + c.sides[x].name + ")";
    const delta = (x) => known(x) ? h("span", {class: "delta"}, (x > 0 ? "+" : "") + fmt(x, 4)) : "–";
    const metrics = h("table", {class: "card compare-metrics"},
      h("thead", {}, h("tr", {}, h("th", {}, "metric"), h("th", {class: "num"}, name("a")), h("th", {class: "num"}, name("b")),
        h("th", {class: "num"}, "B − A"))),
      h("tbody", {}, c.metrics.map((m) => h("tr", {"data-metric": m.metric}, h("td", {}, m.metric),
        h("td", {class: "num"}, fmt(m.a, 4)), h("td", {class: "num"}, fmt(m.b, 4)), h("td", {class: "num"}, delta(m.diff))))));
    const t = c.tasks, f = c.flips;
    const counts = t.both + " task(s) in both" + (t.only_a ? ", " + t.only_a + " only in A" : "") +
      (t.only_b ? ", " + t.only_b + " only in B" : "") + "; " + t.changed + " with an episode whose outcome changed (" +
      f.lost_to_won + " lost → won, " + f.won_to_lost + " won → lost" + (f.other ? ", " + f.other + " to or from an env error" : "") +
      "). Episodes pair up by task and sample number.";
    const wins = (x, w) => h("a", {href: "#/" + x + "/group/" + encodeURIComponent(w.group)}, w.won + " / " + w.n);
    const envs = new Set(c.changed.map((r) => r.env + " " + r.split)).size > 1;
    const rows = c.changed.map((r) => h("tr", {"data-task": r.task},
      h("td", {}, fmt(r.task)), envs ? h("td", {class: "env"}, r.env + " (" + r.split + ")") : null,
      h("td", {class: "num"}, wins("a", r.a)), h("td", {class: "num"}, wins("b", r.b)),
      h("td", {}, h("ul", {class: "flips"}, r.changed.map((p) => h("li", {"data-sample": p.sample},
        "sample " + p.sample + ": ",
        h("a", {href: "#/a/episode/" + p.a, class: outcomeClass(p.from), "data-side": "a"}, "A " + p.from), " → ",
        h("a", {href: "#/b/episode/" + p.b, class: outcomeClass(p.to), "data-side": "b"}, "B " + p.to)))))));
    const changed = c.changed.length ? h("table", {class: "card changed"},
      h("thead", {}, h("tr", {}, ["task", envs ? "env" : null, "A won", "B won", "changed episodes"]
        .filter((x) => x !== null).map((x) => h("th", {}, x)))),
      h("tbody", {}, rows)) : h("p", {class: "muted"}, "No episode changed outcome.");
    display(problemsBox(),
      h("div", {class: "card"}, ["a", "b"].map((x) => h("div", {"data-side": x},
        h("strong", {}, name(x) + " "), h("code", {}, c.sides[x].path), " — " + c.sides[x].episodes + " episodes · ",
        h("a", {href: "#/" + x + "/overview"}, "overview"), " · ", h("a", {href: "#/" + x + "/episodes"}, "episodes")))),
      h("h2", {}, "Metrics"), h("p", {class: "muted"}, c.metrics_from.join("; ")), metrics,
      h("h2", {}, "Tasks whose outcome changed"), h("p", {class: "muted", "data-counts": ""}, counts),
      t.listed < t.changed ? h("p", {class: "muted"}, "The first " + t.listed + " of them are listed.") : null,
      changed);
  }

  function outcomeClass(outcome) { return outcome === "won" || outcome === "win" ? "won" : outcome === "draw" ? "" : "lost"; }

  /** A game of several seats: who played each seat and how it ended for it, then every seat's moves in
   * play order (the seats the policy played with what they saw and replied; the others' moves as played). */
  function gameView(g, id) {
    const color = new Map(g.seats.map((x, i) => [x.seat, PALETTE[i % PALETTE.length]]));
    const seatBadge = (seat) => h("span", {class: "badge seat", style: "border-left: 4px solid " + color.get(seat)}, seat);
    const seats = h("table", {class: "card game-seats"},
      h("thead", {}, h("tr", {}, ["seat", "played by", "outcome", "game reward", "episode"].map((c) => h("th", {}, c)))),
      h("tbody", {}, g.seats.map((x) => h("tr", {"data-seat": x.seat},
        h("td", {}, seatBadge(x.seat)), h("td", {class: "player"}, x.player),
        h("td", {class: "outcome " + outcomeClass(x.outcome)}, x.outcome || "–"), h("td", {class: "num"}, fmt(x.reward, 3)),
        h("td", {}, known(x.episode) ? (x.episode === id ? "this one"
          : h("a", {href: at("episode/" + x.episode)}, "episode " + x.episode)) : h("span", {class: "muted"}, "not trained"))))));
    const moves = g.moves.map((m, n) => h("div", {class: "move" + (m.episode === id ? " this" : ""), "data-seat": m.seat,
      "data-move": n + 1, style: "border-left-color: " + color.get(m.seat)},
      h("div", {}, h("strong", {}, "Move " + (n + 1)), " ", seatBadge(m.seat), h("span", {class: "player muted"}, m.player),
        known(m.episode) ? [" · ", h("a", {href: at("episode/" + m.episode)}, "episode " + m.episode + ", turn " + (m.turn + 1))] : null,
        m.invalid ? h("span", {class: "badge bad"}, "invalid move") : null,
        m.format_ok === false ? h("span", {class: "badge bad"}, "format error") : null),
      known(m.observation) ? [h("div", {class: "label"}, "saw"), h("pre", {class: "observation"}, m.observation)] : null,
      known(m.response) ? [h("div", {class: "label"}, "replied"), h("pre", {class: "response"}, m.response)] : null,
      h("div", {class: "label"}, "move"), h("pre", {class: "action"}, known(m.action) ? m.action || "(empty)" : "(none parsed)")));
    const order = g.order === "recorded" ? "in the order they were played"
      : "the order assumed (seats taking turns): this file keeps no log of the game's moves";
    return h("div", {class: "game", "data-game": g.key},
      h("h2", {}, "The game"), seats,
      h("p", {class: "muted"}, g.moves.length + " moves, " + order + ". A seat the policy played shows what it saw and replied; " +
        "the other seats' moves are shown as they were played. The game reward is the env's, per seat; an episode's " +
        "reward (in the list) is the run's reward.weights applied to its turns, and may differ."),
      moves);
  }

  // ---- a search tree ---------------------------------------------------------------------
  async function showTree(key) {
    const t = await api.tree(key);
    const children = new Map();
    for (const node of t.nodes) {
      if (node.parent === null) continue;
      if (!children.has(node.parent)) children.set(node.parent, []);
      children.get(node.parent).push(node);
    }
    function item(node) {
      const kids = children.get(node.id) || [];
      const head = h("span", {class: "head"}, node.id === 0 ? "root (the prompt)" : "#" + node.id + " ",
        node.id === 0 ? null : h("code", {}, node.action === null ? "(no action)" : node.action),
        node.reward !== null && node.id !== 0 ? h("span", {class: "muted"}, " reward " + fmt(node.reward, 3)) : null,
        known(node.score) ? h("span", {class: "muted"}, " · score " + fmt(node.score, 3)) : null,
        node.end ? h("span", {class: "badge" + (node.won ? " good" : "")}, node.end + (node.won ? " · won" : "")) : null,
        node.episodes.length ? [" ", h("a", {href: at("episode/" + node.episodes[0])}, "path")] : null);
      head.addEventListener("mousemove", (ev) => { if (node.response) showTip(ev, node.response); });
      head.addEventListener("mouseleave", hideTip);
      return h("li", {class: "node" + (node.chosen ? " chosen" : ""), "data-node": node.id}, head,
        kids.length ? h("ul", {}, kids.map(item)) : null);
    }
    const root = t.nodes.find((n) => n.id === 0);
    display(problemsBox(),
      h("p", {}, h("a", {href: at("group/" + encodeURIComponent(key))}, "← the group as columns")),
      h("h2", {}, "Search tree of group " + key),
      h("p", {class: "muted"}, t.paths + " root-to-leaf paths, " + (t.nodes.length - 1) + " nodes" +
        (t.truncated ? " (cut at " + t.nodes.length + ")" : "") +
        ". ★ marks the path the search chose; hover a node for its response."),
      h("ul", {class: "tree card"}, item(root)));
  }

  // ---- start ------------------------------------------------------------------------------
  home.run().then((data) => {
    run = data;
    if (data.kind === "compare") {
      comparison = data;
      for (const name of ["a", "b"]) {
        sides[name] = {api: saved ? localApi(saved.sides[name]) : remoteApi("api/" + name + "/"), run: null};
      }
      compareNav();
    }
    document.title = "omrl view · " + data.title;
    document.querySelector("header.top h1").textContent = "omrl view · " + data.title;
    document.querySelector("header.top .path").textContent = data.path;
    window.addEventListener("hashchange", route);
    route();
  }).catch((err) => {
    display(h("div", {class: "card problems"}, h("strong", {}, "Could not load the run: "), err.message));
  });
})();
