// paraplan serve: the page asks the local server for predictions as fields change.
// Plain JavaScript, no build step; every number comes from the server (the package's API).
"use strict";

const POST_HEADERS = { "Content-Type": "application/json", "X-Paraplan": "1" };

function fields(form) {
  const data = {};
  for (const el of form.querySelectorAll("[name]")) {
    if (el.type === "radio" && !el.checked) continue;
    if (el.type === "file") continue;
    data[el.name] = el.value;
  }
  return data;
}

function showWhen(form) {
  const data = fields(form);
  for (const part of form.querySelectorAll("[data-when]")) {
    const [name, values] = part.dataset.when.split("=");
    part.hidden = !values.split(",").includes(data[name]);
  }
}

function clearErrors(form, result) {
  for (const m of form.querySelectorAll(".msg")) m.textContent = "";
  for (const f of form.querySelectorAll(".field.bad")) f.classList.remove("bad");
  if (result) result.querySelector(".form-error").textContent = "";
}

function showError(form, result, answer) {
  const field = answer.field && form.querySelector(`.field[data-field="${answer.field}"]`);
  if (field && !field.closest("[hidden]")) {
    field.classList.add("bad");
    field.querySelector(".msg").textContent = answer.error;
  } else {
    result.querySelector(".form-error").textContent = answer.error;
  }
  result.classList.add("stale");
}

const fmt = {
  s(x) {
    if (x == null) return "–";
    if (x >= 86400 * 2) return (x / 86400).toFixed(1) + " days";
    if (x >= 3600 * 2) return (x / 3600).toFixed(1) + " h";
    if (x >= 1) return x.toFixed(x >= 100 ? 0 : 2) + " s";
    return (x * 1000).toFixed(x >= 0.01 ? 1 : 2) + " ms";
  },
  gb(x) { return x == null ? "–" : (x / 1e9).toFixed(1) + " GB"; },
  pct(x) { return x == null ? "–" : (100 * x).toFixed(1) + " %"; },
  n(x) { return x == null ? "–" : Math.round(x).toLocaleString("en-US"); },
  usd(x) { return x == null ? "–" : "$" + (x >= 100 ? Math.round(x).toLocaleString("en-US") : x.toFixed(2)); },
};

function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function table(header, rows, cls = "") {
  return `<table class="${cls}"><thead><tr>${header.map((h) => `<th>${esc(h)}</th>`).join("")}</tr></thead><tbody>` +
    rows.map((r) => `<tr>${r.map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("") + "</tbody></table>";
}

function interval(p) {
  const i = p.interval || p.iteration_s_interval;
  if (!i) return "";
  const lo = i.low ?? i.lower ?? i[0], hi = i.high ?? i.upper ?? i[1];
  return lo == null ? "" : ` <small class="interval">(${fmt.s(lo)} – ${fmt.s(hi)})</small>`;
}

function renderPrediction(result, answer) {
  const p = answer.prediction, m = p.memory, c = p.cost || {};
  result.classList.remove("stale");
  result.dataset.key = answer.key;
  const card = (label, value, cls = "") => `<div class="card ${cls}"><span>${esc(label)}</span><b>${value}</b></div>`;
  result.querySelector(".headline").innerHTML =
    `<h2>${esc(p.job)}</h2><p class="what">${esc(p.model)} · ${p.seq_length.toLocaleString("en-US")} tokens · ` +
    `${p.num_gpus} × ${esc(p.gpu)} (${esc(p.cluster)}) · ${esc(p.precision)}</p><div class="cards">` +
    card("iteration", `<span class="iteration">${esc(fmt.s(p.iteration_s))}</span>` + interval(p)) +
    card("tokens / s", esc(fmt.n(p.tokens_per_s))) +
    card("MFU", esc(fmt.pct(p.mfu))) +
    card("memory / GPU", `${esc(fmt.gb(m.total_bytes))} of ${esc(fmt.gb(m.hbm_bytes))}`, m.fits ? "" : "over") +
    card("$ / hour", esc(fmt.usd(c.cost_per_hour_usd))) +
    card("time to train", esc(fmt.s(c.time_to_train_s))) +
    card("cost to train", esc(fmt.usd(c.cost_to_train_usd))) + "</div>" +
    (m.fits ? "" : `<p class="warn">Does not fit: ${esc(fmt.gb(m.total_bytes))} needed per GPU.</p>`);
  const total = p.iteration_s;
  const parts = Object.entries(p.breakdown).filter(([, v]) => v > 0)
    .map(([k, v]) => [k.replace(/_s$/, "").replaceAll("_", " "), fmt.s(v), fmt.pct(v / total)]);
  const mem = ["weights", "gradients", "optimizer_states", "activations", "logits", "gathered_params", "buffers",
    "fragmentation", "runtime"].filter((k) => m[k + "_bytes"] > 0).map((k) => [k.replaceAll("_", " "), fmt.gb(m[k + "_bytes"])]);
  const stages = (m.per_stage_total_bytes || []).map((b, i) => [`stage ${i}`, fmt.gb(b), p.parallel.layers_per_stage[i] ?? ""]);
  const plan = Object.entries(p.parallel).filter(([k]) => k !== "layers_per_stage").map(([k, v]) => `${k} ${v}`).join(" · ");
  result.querySelector(".tables").innerHTML = `<p class="plan-line">${esc(plan)}</p><div class="grid">` +
    `<div><h3>Breakdown</h3>${table(["part", "time", "share"], parts, "num")}</div>` +
    `<div><h3>Memory (worst stage ${m.worst_stage})</h3>${table(["part", "per GPU"], mem, "num")}</div>` +
    `<div><h3>Memory per stage</h3>${table(["stage", "per GPU", "layers"], stages, "num stages")}</div></div>`;
  result.querySelector(".pictures").innerHTML = Object.entries(answer.pictures)
    .map(([kind, url]) => `<figure class="${kind}"><img src="${url}" alt="${kind} picture"><figcaption>${kind}</figcaption></figure>`).join("");
  result.querySelector(".downloads").innerHTML = "Download: " + Object.entries(answer.downloads)
    .map(([name, url]) => `<a href="${url}" download data-download="${name}">${esc(name)}</a>`).join(" ");
  result.querySelector(".notes").innerHTML = [...answer.notes, ...(p.uncalibrated || [])]
    .map((n) => `<li>${esc(n)}</li>`).join("");
}

// one request in flight per form: a newer change aborts the older one
const inflight = new WeakMap();

async function predict(form, result) {
  inflight.get(form)?.abort();
  const control = new AbortController();
  inflight.set(form, control);
  let answer, response;
  try {
    response = await fetch("/api/predict", { method: "POST", headers: POST_HEADERS, body: JSON.stringify(fields(form)), signal: control.signal });
    answer = await response.json();
  } catch (e) {
    if (e.name === "AbortError") return null;
    answer = { error: "the server did not answer (is paraplan serve still running?)" };
  }
  clearErrors(form, result);
  if (!response || !response.ok) { showError(form, result, answer); return null; }
  renderPrediction(result, answer);
  form.dispatchEvent(new CustomEvent("predicted", { detail: answer }));
  return answer;
}

function debounce(fn, ms) {
  let t;
  return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
}

async function upload(form, input, result) {
  const field = input.closest(".field");
  const file = input.files[0];
  if (!file) return false;
  const response = await fetch("/api/upload?name=" + encodeURIComponent(file.name),
    { method: "POST", headers: { "X-Paraplan": "1", "Content-Type": "application/octet-stream" }, body: file });
  const answer = await response.json();
  clearErrors(form, result);
  if (!response.ok) {
    form.querySelector('[name="hf_config"]').value = "";
    field.classList.add("bad");
    field.querySelector(".msg").textContent = answer.error;
    return false;
  }
  form.querySelector('[name="hf_config"]').value = answer.id;
  return true;
}

function fillFromQuery(form) {
  const query = new URLSearchParams(location.search);
  for (const [name, value] of query) {
    for (const el of form.querySelectorAll(`[name="${CSS.escape(name)}"]`)) {
      if (el.type === "radio") el.checked = el.value === value;
      else el.value = value;
    }
  }
}

function liveForm(form, result) {
  const again = debounce(() => predict(form, result), 120);
  form.addEventListener("input", (e) => { if (e.target.type !== "file") { showWhen(form); again(); } });
  form.addEventListener("change", async (e) => {
    showWhen(form);
    if (e.target.classList.contains("upload") && !(await upload(form, e.target, result))) return;
    again();
  });
  form.addEventListener("submit", (e) => { e.preventDefault(); predict(form, result); });
  showWhen(form);
  return predict(form, result);
}

function comparisonTable(c) {
  const rows = Object.entries(c.difference).filter(([, d]) => d.a || d.b).map(([k, d]) => {
    const f = /tokens_per_s|fits/.test(k) ? fmt.n : /bytes|memory\.(total|hbm|margin|weights|gradients|optimizer|activations|logits|gathered|buffers|fragmentation|runtime)/.test(k) ? fmt.gb
      : /_s$|^breakdown\./.test(k) ? fmt.s : /usd/.test(k) ? fmt.usd : /mfu|hfu|fraction|headroom/.test(k) ? fmt.pct : fmt.n;
    const rel = d.relative == null ? "" : (d.relative >= 0 ? "+" : "") + (100 * d.relative).toFixed(1) + " %";
    const label = k.replace(/_bytes$/, "").replace(/([^r])_s$/, "$1").replaceAll("_", " ");
    if (/fits/.test(k)) return [label, d.a ? "yes" : "no", d.b ? "yes" : "no", ""];
    return [label, f(d.a), f(d.b), rel];
  });
  const differ = Object.entries(c.settings_that_differ || {}).map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join("; ");
  return (differ ? `<p class="plan-line">differs: ${esc(differ)}</p>` : "") + table(["", "A", "B", "B − A"], rows, "num compare");
}

async function compareKeys(box, a, b) {
  const response = await fetch("/api/compare", { method: "POST", headers: POST_HEADERS, body: JSON.stringify({ a, b }) });
  const answer = await response.json();
  box.querySelector(".tables").innerHTML = response.ok ? comparisonTable(answer) : `<p class="msg">${esc(answer.error)}</p>`;
}

function comparePage() {
  const box = document.getElementById("comparison");
  const keys = {};
  for (const side of ["a", "b"]) {
    const form = document.getElementById("job-" + side);
    form.addEventListener("predicted", (e) => {
      keys[side] = e.detail.key;
      if (keys.a && keys.b) compareKeys(box, keys.a, keys.b);
    });
    if (side === "b") form.querySelector('[name="tp"]').value = "4";
    liveForm(form, document.getElementById("prediction-" + side));
  }
}

function planCells(p) {
  const plan = ["tp", "pp", "dp", "cp", "vpp", "ep", "micro_batch_size", "zero_stage", "recompute", "schedule"]
    .filter((k) => p[k] !== undefined).map((k) => `${k.replace("micro_batch_size", "mbs").replace("zero_stage", "zero")} ${p[k]}`).join(" ");
  return [p.rank, p.gpus, plan, fmt.s(p.iteration_s), fmt.n(p.tokens_per_s), fmt.pct(p.mfu), fmt.gb(p.memory_per_gpu_bytes),
    fmt.usd(p.usd_per_million_tokens)];
}

function plansTable(rows, which) {
  const head = ["", "#", "GPUs", "plan", "iteration", "tokens/s", "MFU", "memory", "$/M tok"];
  return `<table class="num plans"><thead><tr>${head.map((h) => `<th>${h}</th>`).join("")}</tr></thead><tbody>` +
    rows.map((p, i) => `<tr data-which="${which}" data-index="${i}" tabindex="0" title="predict this plan">` +
      `<td><input type="checkbox" aria-label="pick plan for compare" data-which="${which}" data-index="${i}"></td>` +
      planCells(p).map((c) => `<td>${esc(c)}</td>`).join("") + "</tr>").join("") + "</tbody></table>";
}

function searchPage() {
  const form = document.getElementById("search");
  const box = document.getElementById("search-result");
  const result = document.getElementById("prediction");
  const run = document.getElementById("run"), cancel = document.getElementById("cancel");
  const bar = document.getElementById("progress"), status = document.getElementById("status");
  const picked = [];
  let current = null;
  form.addEventListener("change", async (e) => {
    showWhen(form);
    if (e.target.classList.contains("upload")) await upload(form, e.target, box);
  });
  showWhen(form);
  async function predictPlan(which, index) {
    const response = await fetch(`/api/search/${current}/${which}/${index}`, { method: "POST", headers: POST_HEADERS });
    const answer = await response.json();
    if (!response.ok) { result.querySelector(".form-error").textContent = answer.error; return null; }
    renderPrediction(result, answer);
    result.querySelector(".downloads").insertAdjacentHTML("beforeend",
      ` · <a class="open" href="${esc("/?" + new URLSearchParams(answer.fields))}">open in the predict page</a>`);
    result.scrollIntoView({ block: "start" });
    return answer;
  }
  box.addEventListener("click", async (e) => {
    const tick = e.target.closest("input[type=checkbox]");
    if (tick) {
      const id = `${tick.dataset.which}/${tick.dataset.index}`;
      if (tick.checked) picked.push(id); else picked.splice(picked.indexOf(id), 1);
      while (picked.length > 2) {
        const old = picked.shift();
        const [w, i] = old.split("/");
        box.querySelector(`input[data-which="${w}"][data-index="${i}"]`).checked = false;
      }
      document.getElementById("compare-picked").disabled = picked.length !== 2;
      return;
    }
    const row = e.target.closest("tr[data-index]");
    if (row) predictPlan(row.dataset.which, row.dataset.index);
  });
  document.getElementById("compare-picked").addEventListener("click", async () => {
    const keys = [];
    for (const id of picked) {
      const [w, i] = id.split("/");
      const answer = await predictPlan(w, i);
      if (!answer) return;
      keys.push(answer.key);
    }
    compareKeys(box.querySelector(".comparison"), keys[0], keys[1]);
  });
  cancel.addEventListener("click", async () => {
    if (current) await fetch(`/api/search/${current}/cancel`, { method: "POST", headers: POST_HEADERS });
  });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    clearErrors(form, box);
    box.querySelector(".plans").innerHTML = box.querySelector(".pareto").innerHTML = box.querySelector(".summary").innerHTML = "";
    const response = await fetch("/api/search", { method: "POST", headers: POST_HEADERS, body: JSON.stringify(fields(form)) });
    const answer = await response.json();
    if (!response.ok) { showError(form, box, answer); return; }
    current = answer.id;
    run.disabled = true; cancel.disabled = false; bar.hidden = false; bar.value = 0;
    status.textContent = "searching…";
    let state;
    do {
      await new Promise((r) => setTimeout(r, 250));
      state = await (await fetch(`/api/search/${current}`)).json();
      bar.value = state.done;
      status.textContent = `${state.state} · ${Math.round(100 * state.done)} % · ${state.elapsed_s.toFixed(1)} s`;
    } while (state.state === "running");
    run.disabled = false; cancel.disabled = true; bar.hidden = true;
    if (state.state === "error") { showError(form, box, { error: state.error, field: null }); return; }
    if (state.state !== "done") return;
    const r = state.result;
    const excluded = Object.entries(r.excluded).map(([k, v]) => `${v.toLocaleString("en-US")} ${k}`).join("; ");
    box.querySelector(".summary").innerHTML = `<p><b>${r.plans.length}</b> best of ${r.considered.toLocaleString("en-US")} plans considered` +
      (excluded ? ` (excluded: ${esc(excluded)})` : "") + ". Click a plan to predict it.</p>" +
      (r.no_plan ? `<p class="warn">${esc(r.no_plan)}</p>` : "");
    box.querySelector(".plans").innerHTML = r.plans.length ? `<h3>Plans</h3>` + plansTable(r.plans, "plans") : "";
    if (r.pareto) {
      box.querySelector(".pareto").innerHTML = `<h3>Pareto front (time against ${esc(r.pareto_axis)})</h3>` +
        (state.pareto_picture ? `<img src="${state.pareto_picture}" alt="Pareto front picture">` : "") + plansTable(r.pareto, "front");
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const page = document.body.dataset.page;
  if (page === "predict") {
    const form = document.getElementById("job");
    fillFromQuery(form);
    liveForm(form, document.getElementById("prediction"));
  } else if (page === "compare") comparePage();
  else if (page === "search") searchPage();
});
