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

function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// every figure is text the server wrote with the CLI's own formatting (GiB, "17.240 s (80 %: 16.9-21.9 s)")
// a figure with its interval, "19.778 s (80 %: 18.3-25 s)": the bounds on a line of their own
function figure(text) {
  const cut = String(text).indexOf(" (");
  if (cut < 0 || !String(text).includes(" %: ")) return esc(text);
  return `${esc(text.slice(0, cut))} <small class="interval">${esc(text.slice(cut + 1))}</small>`;
}

function table(header, rows, cls = "", numbers = []) {
  const td = (c, i, tag = "td") => `<${tag}${numbers[i] ? ' class="n"' : ""}>${tag === "td" ? figure(c) : esc(c)}</${tag}>`;
  return `<table class="${cls}">` + (header.length ? `<thead><tr>${header.map((h, i) => td(h, i, "th")).join("")}</tr></thead>` : "") +
    `<tbody>${rows.map((r) => `<tr>${r.map((c, i) => td(c, i)).join("")}</tr>`).join("")}</tbody></table>`;
}

function cliTable(t, cls = "") {
  return `<div><h3>${esc(t.title)}</h3>${table(t.header, t.rows, cls, t.numbers)}</div>`;
}

function renderPrediction(result, answer) {
  const p = answer.prediction, s = answer.shown;
  result.classList.remove("stale");
  result.dataset.key = answer.key;
  const card = ([label, text], cls = "") => {  // "19.778 s (80 %: 18.3-25 s)": the figure, then its interval
    const cut = text.indexOf(" (");
    const of = text.indexOf(" of ");  // memory: "39.16 GiB of 79.65 GiB HBM"
    const [value, bounds] = cut > 0 && text.includes(" %: ") ? [text.slice(0, cut), text.slice(cut + 1)]
      : of > 0 ? [text.slice(0, of), text.slice(of + 1)] : [text, ""];
    return `<div class="card ${cls}"><span>${esc(label)}</span><b class="value${cls === "time" ? " iteration" : ""}">${esc(value)}</b>` +
      (bounds ? ` <small class="${of > 0 && cut < 0 ? "of" : "interval"}">${esc(bounds)}</small>` : "") + "</div>";
  };
  result.querySelector(".headline").innerHTML =
    `<h2>${esc(p.job)}</h2><p class="what">${esc(s.lines[0] || "")}</p><p class="seq">${esc(s.seq_length)}</p><div class="cards">` +
    s.cards.map((c, i) => card(c, i === 0 ? "time" : c[0] === "memory / GPU" && !s.fits ? "over" : "")).join("") + "</div>" +
    (s.fits ? "" : `<p class="warn">Does not fit: ${esc(s.cards[3][1])} per GPU.</p>`) +
    `<ul class="interval-rule">${s.interval.map((l) => `<li>${esc(l)}</li>`).join("")}</ul>`;
  result.querySelector(".tables").innerHTML = (s.lines.length > 1 ? s.lines.slice(1).map((l) => `<p class="plan-line">${esc(l)}</p>`).join("") : "") +
    `<div class="grid">${s.tables.map((t) => cliTable(t, "num")).join("")}` +
    cliTable({ title: "Memory per stage", header: ["stage", "per GPU", "layers"], rows: s.stages, numbers: [true, true, true] }, "num stages") + "</div>";
  result.querySelector(".pictures").innerHTML = Object.entries(answer.pictures)
    .map(([kind, url]) => `<figure class="${kind}"><img src="${url}" alt="${kind} picture"><figcaption>${kind}</figcaption></figure>`).join("");
  result.querySelector(".downloads").innerHTML = "Download: " + Object.entries(answer.downloads)
    .map(([name, url]) => `<a href="${url}" download data-download="${name}">${esc(name)}</a>`).join(" ");
  result.querySelector(".notes").innerHTML = answer.notes.map((n) => `<li>${esc(n)}</li>`).join("");
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

function comparisonBlocks(blocks) {
  return blocks.map((b) => b.rows ? table(b.header, b.rows, "num compare", b.numbers) : `<p class="plan-line">${esc(b.line)}</p>`).join("");
}

async function compareKeys(box, a, b, level) {
  const response = await fetch("/api/compare", { method: "POST", headers: POST_HEADERS, body: JSON.stringify({ a, b, interval: level }) });
  const answer = await response.json();
  box.querySelector(".tables").innerHTML = response.ok ? comparisonBlocks(answer.shown) : `<p class="msg">${esc(answer.error)}</p>`;
}

function comparePage() {
  const box = document.getElementById("comparison");
  const keys = {};
  for (const side of ["a", "b"]) {
    const form = document.getElementById("job-" + side);
    form.addEventListener("predicted", (e) => {
      keys[side] = e.detail.key;
      if (keys.a && keys.b) compareKeys(box, keys.a, keys.b, e.detail.prediction.interval.level);
    });
    if (side === "b") form.querySelector('[name="tp"]').value = "4";
    liveForm(form, document.getElementById("prediction-" + side));
  }
}

function plansTable(shown, which) {
  const head = ["", ...shown.header];
  return (shown.shared ? `<p class="plan-line">every plan: ${esc(shown.shared)}</p>` : "") + `<table class="num plans"><thead><tr>${head.map((h, i) => `<th${shown.numbers[i - 1] ? ' class="n"' : ""}>${esc(h)}</th>`).join("")}</tr></thead><tbody>` +
    shown.rows.map((r, i) => `<tr data-which="${which}" data-index="${i}" tabindex="0" title="predict this plan">` +
      `<td><input type="checkbox" aria-label="pick plan for compare" data-which="${which}" data-index="${i}"></td>` +
      r.map((c, j) => `<td${shown.numbers[j] ? ' class="n"' : ""}>${esc(c)}</td>`).join("") + "</tr>").join("") + "</tbody></table>";
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
    compareKeys(box.querySelector(".comparison"), keys[0], keys[1], fields(form).interval);
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
      const stage = state.state !== "running" ? state.state : (state.stage === "screen" ? "screening every plan" : "predicting the shortlist") +
        (state.configurations > 1 ? ` (configuration ${state.configuration} of ${state.configurations})` : "");
      status.textContent = `${stage} · ${Math.round(100 * state.done)} % · ${state.elapsed_s.toFixed(1)} s`;
    } while (state.state === "running");
    run.disabled = false; cancel.disabled = true; bar.hidden = true;
    if (state.state === "error") { showError(form, box, { error: state.error, field: null }); return; }
    if (state.state !== "done") return;
    const r = state.result;
    const excluded = Object.entries(r.excluded).map(([k, v]) => `${v.toLocaleString("en-US")} ${k}`).join("; ");
    box.querySelector(".summary").innerHTML = `<p><b>${r.plans.length}</b> best of ${r.considered.toLocaleString("en-US")} plans considered` +
      (excluded ? ` (excluded: ${esc(excluded)})` : "") + ". Click a plan to predict it.</p>" +
      (r.interval ? r.interval.lines.map((l) => `<p class="plan-line interval-rule">${esc(l)}</p>`).join("") : "") +
      (r.no_plan ? `<p class="warn">${esc(r.no_plan)}</p>` : "");
    box.querySelector(".plans").innerHTML = r.plans.length ? `<h3>Plans</h3>` + plansTable(state.shown.plans, "plans") : "";
    if (r.pareto) {
      box.querySelector(".pareto").innerHTML = `<h3>Pareto front (time against ${esc(r.pareto_axis)})</h3>` +
        (state.pareto_picture ? `<img src="${state.pareto_picture}" alt="Pareto front picture">` : "") + plansTable(state.shown.pareto, "front");
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
