// The console: a client of the admin API (/admin/), one page at a time.
// The admin key is entered once per tab, kept in sessionStorage and sent as a bearer
// token; nothing else is stored. Every view is bounded: lists are polled one call at
// a time while the tab is visible and show at most ROWS_SHOWN rows, a request's live
// tokens at most TOKENS_SHOWN (the earlier ones counted, not kept).
"use strict";
(() => {
  const body = document.body;
  const PAGE = body.dataset.page;
  const POLL_MS = Number(body.dataset.pollMs);
  const TOKENS_SHOWN = Number(body.dataset.tokensShown);
  const ROWS_SHOWN = Number(body.dataset.rowsShown);
  const STORE = "llmq-admin-key";
  const $ = (id) => document.getElementById(id);

  class Refused extends Error {}

  const adminKey = () => sessionStorage.getItem(STORE);

  function showError(message) {
    $("error").textContent = message || "";
    $("error").hidden = !message;
  }

  function showLogin(message) {
    $("login").hidden = false;
    $("content").hidden = true;
    $("logout").hidden = true;
    showError(message);
  }

  async function api(method, path, payload) {
    const headers = { Authorization: "Bearer " + adminKey() };
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    const init = { method, headers };
    if (payload !== undefined) init.body = JSON.stringify(payload);
    const r = await fetch(path, init);
    const data = await r.json().catch(() => ({}));
    const message = (data.error && data.error.message) || "HTTP " + r.status;
    if (r.status === 401 || r.status === 403) {
      sessionStorage.removeItem(STORE);
      showLogin(message);
      throw new Refused(message);
    }
    if (!r.ok) throw new Error(message);
    return data;
  }

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }

  function cells(values, attrs) {
    const tr = el("tr", undefined, attrs);
    for (const v of values) {
      const td = el("td");
      if (v instanceof Node) td.append(v);
      else td.textContent = v === null || v === undefined ? "–" : String(v);
      tr.append(td);
    }
    return tr;
  }

  function fill(tableId, rows) {
    $(tableId).tBodies[0].replaceChildren(...rows.slice(0, ROWS_SHOWN));
  }

  function action(label, run, cls) {
    const b = el("button", label, { type: "button", class: cls || "" });
    b.addEventListener("click", async () => {
      b.disabled = true;
      try {
        await run();
        showError("");
        await refresh();
      } catch (e) {
        if (!(e instanceof Refused)) showError(e.message);
      } finally {
        b.disabled = false;
      }
    });
    return b;
  }

  const when = (ts) => (ts ? new Date(ts * 1000).toLocaleString() : "–");
  const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
  // A worker's pace: how long a run holds a slot, how long a KV block of a prompt takes.
  const pace = (p) => {
    const parts = [];
    if (p && p.service_ms) parts.push(`run ${(p.service_ms / 1000).toFixed(2)} s`);
    if (p && p.block_us) parts.push(`block ${(p.block_us / 1000).toFixed(1)} ms`);
    return parts.join(" · ") || "–";
  };
  const link = (id) => el("a", id, { href: "/console/requests/" + encodeURIComponent(id) });

  // A tenant's requests per minute over the hour (oldest first) as an inline SVG: a bar
  // per minute, its refused part (throttled or shed) on top in red, against the peak.
  function sparkline(h) {
    const NS = "http://www.w3.org/2000/svg";
    const refused = h.rate_limited.map((v, i) => v + h.shed[i]);
    const all = h.accepted.map((v, i) => v + refused[i]);
    const w = 2 * all.length, ht = 24, top = Math.max(0, ...all);
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", `0 0 ${w} ${ht}`);
    svg.setAttribute("class", "spark");
    svg.setAttribute("role", "img");
    const title = document.createElementNS(NS, "title");
    title.textContent = `requests per minute, last hour (peak ${top}; red: refused)`;
    svg.append(title);
    const bar = (i, from, n, cls) => {
      if (n <= 0) return;
      const r = document.createElementNS(NS, "rect");
      const y0 = (from / top) * ht, tall = Math.max(1, (n / top) * ht);
      for (const [k, x] of Object.entries({ x: 2 * i, y: ht - y0 - tall, width: 1.6, height: tall, class: cls })) {
        r.setAttribute(k, String(x));
      }
      svg.append(r);
    };
    all.forEach((_, i) => {
      bar(i, 0, h.accepted[i], "ok");
      bar(i, h.accepted[i], refused[i], "refused");
    });
    return svg;
  }

  const sum = (xs) => xs.reduce((a, b) => a + b, 0);

  function formObject(form) {
    const out = {};
    for (const [k, v] of new FormData(form).entries()) {
      if (v === "") continue;
      const input = form.elements[k];
      out[k] = input && input.type === "number" ? Number(v) : v;
    }
    return out;
  }

  function onSubmit(id, run) {
    const form = $(id);
    if (!form) return;
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        await run(form);
        showError("");
        await refresh();
      } catch (e) {
        if (!(e instanceof Refused)) showError(e.message);
      }
    });
  }

  // A select's options, replaced only when they changed (a poll keeps the choice made).
  function options(select, pairs) {
    const now = [...select.options].map((o) => o.value).join("\n");
    if (now === pairs.map(([v]) => v).join("\n")) return;
    const chosen = select.value;
    select.replaceChildren(...pairs.map(([v, label]) => el("option", label, { value: v })));
    if (pairs.some(([v]) => v === chosen)) select.value = chosen;
  }

  // A policy change from the form: the refusal, naming the key, stays shown until the
  // next change is made.
  async function changePolicy(change) {
    const form = $("policy-change");
    const model = form.elements.model.value;
    const query = model ? "?model=" + encodeURIComponent(model) : "";
    try {
      const made = await api("PATCH", "/admin/policy" + query, change);
      $("policy-refused").hidden = true;
      $("policy-changed").hidden = false;
      $("policy-changed").textContent = `${made.scope}: version ${made.version}`;
      await refresh();
    } catch (e) {
      if (e instanceof Refused) return;
      $("policy-changed").hidden = true;
      $("policy-refused").hidden = false;
      $("policy-refused").textContent = "Refused, nothing changed: " + e.message;
    }
  }

  // A value as typed: JSON where it parses (200, true, null), else the text itself.
  function typed(text) {
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }

  // --- the pages --------------------------------------------------------------------

  const views = {
    async pool() {
      const data = await api("GET", "/admin/pool");
      fill("models", data.models.map((m) =>
        cells([m.model, m.workers, `${m.used} / ${m.slots}`, m.queued], { "data-model": m.model })));
      fill("workers", data.workers.map((w) => cells([
        w.id, w.host, w.model, w.engine, `${w.used} / ${w.slots}`, w.free, pct(w.cache_hit_rate),
        el("span", pace(w.pace), { "data-pace": w.id }),
        w.draining ? "draining" : w.ready ? "ready" : "not ready",
        w.draining ? "" : action("Drain", () => api("POST", `/admin/workers/${encodeURIComponent(w.id)}/drain`), "danger"),
      ], { "data-worker": w.id })));
    },

    async queue() {
      const data = await api("GET", "/admin/queue");
      fill("queues", data.models.map((q) => cells([
        q.model, q.depth, q.running, q.held,
        Object.entries(q.by_priority).map(([p, n]) => `${p}: ${n}`).join(", ") || "–",
        Object.entries(q.by_tenant).slice(0, 10).map(([t, n]) => `${t}: ${n}`).join(", ") || "–",
        q.batch,
      ], { "data-model": q.model })));
      const query = new URLSearchParams(formObject($("filter")));
      query.set("limit", String(ROWS_SHOWN));
      const listed = await api("GET", "/admin/requests?" + query);
      fill("requests", listed.data.map((r) => cells([
        link(r.id), r.model, r.tenant, r.status, r.priority, r.worker, r.completion_tokens,
      ], { "data-request": r.id, "data-status": r.status })));
      const more = listed.matched - listed.data.length;
      $("requests-more").hidden = more <= 0;
      $("requests-more").textContent = `${more}${listed.complete ? "" : "+"} more not shown`;
    },

    async request() {
      const id = body.dataset.request;
      const r = await api("GET", `/admin/requests/${encodeURIComponent(id)}`);
      const shown = ["status", "model", "tenant", "priority", "worker", "attempts", "position",
        "prompt_tokens", "completion_tokens", "finish_reason", "error"];
      const dl = $("record");
      dl.replaceChildren();
      for (const k of shown) {
        if (r[k] === undefined || r[k] === null) continue;
        dl.append(el("dt", k.replace("_", " ")), el("dd", r[k], { "data-field": k }));
      }
      dl.append(el("dt", "created"), el("dd", when(r.created_at)));
      if (r.prompt !== null && $("prompt").textContent === "") $("prompt").textContent = r.prompt;
      fill("lifecycle", r.lifecycle.map((e) => cells([
        when(e.ts), e.event, e.worker, e.attempt,
        ["queue_ms", "ttft_ms", "e2e_ms", "finish_reason", "completion_tokens"]
          .filter((k) => e[k] !== undefined).map((k) => `${k} ${e[k]}`).join(", "),
      ], { "data-event": e.event })));
      $("cancel").hidden = !["queued", "running"].includes(r.status);
      tokens.start(id);
    },

    async tenants() {
      const data = await api("GET", "/admin/tenants");
      fill("tenants", data.data.map((t) => {
        const u = t.usage, h = t.last_hour;
        const hour = el("span");
        const totals = el("div", `${sum(h.tokens)} tok, ${sum(h.accepted)} req, `, { class: "hour" });
        totals.append(el("span", sum(h.rate_limited), { "data-hour-throttled": t.name }),
          ` throttled, ${sum(h.shed)} shed`);
        hour.append(sparkline(h), totals);
        return cells([
          t.name, t.weight ?? 1, t.tokens_per_minute || "–", t.requests_per_minute || "–",
          t.max_concurrent || "–", u.queued, u.running, u.tokens, u.accepted,
          el("span", u.rate_limited, { "data-throttled": t.name }), u.shed, hour,
        ], { "data-tenant": t.name });
      }));
    },

    async keys() {
      const data = await api("GET", "/admin/keys");
      fill("keys", data.data.map((k) => cells([
        k.id, k.admin ? `admin (${k.name})` : k.tenant, k.hint + "…", when(k.created_at),
        action("Revoke", () => api("DELETE", `/admin/keys/${k.id}`), "danger"),
      ], { "data-key": k.id })));
    },

    async batches() {
      const data = await api("GET", `/admin/batches?limit=${ROWS_SHOWN}`);
      fill("batches", data.data.map((b) => {
        const c = b.request_counts || {};
        const done = (c.completed || 0) + (c.failed || 0);
        const bar = el("span");
        bar.append(el("progress", undefined, { max: String(c.total || 1), value: String(done) }),
          el("span", ` ${done} / ${c.total || 0}`, { "data-progress": b.id }));
        const open = ["validating", "in_progress"].includes(b.status);
        const acts = el("span");
        if (open) acts.append(action("Cancel", () => api("POST", `/admin/batches/${b.id}/cancel`), "danger"));
        if (b.output_file_id) acts.append(action("Output", () => download(b.id, "output")));
        if (b.error_file_id) acts.append(action("Errors", () => download(b.id, "errors")));
        return cells([
          b.id, b.tenant, b.model, b.status, bar,
          el("span", b.lines_per_minute ?? "–", { "data-rate": b.id }),
          c.failed || 0, when(b.created_at), acts,
        ], { "data-batch": b.id, "data-status": b.status });
      }));
    },

    async policy() {
      const data = await api("GET", "/admin/policy");
      $("policy-version").textContent = data.version;
      const models = Object.keys(data.models);
      const keys = Object.keys(data.pool);
      options($("policy-key"), keys.map((k) => [k, k]));
      options($("policy-scope"), [["", "pool"], ...models.map((m) => [m, `model ${m}`])]);
      const head = $("policy").tHead.rows[0];
      head.replaceChildren(el("th", "Key"), el("th", "Pool"), ...models.map((m) => el("th", m)));
      const shown = (v, key, scope) => {
        const span = el("span", undefined, { "data-key": key, "data-scope": scope });
        span.append(el("code", JSON.stringify(v.value)),
          el("span", v.source, { class: `source source-${v.source}` }));
        return span;
      };
      fill("policy", keys.map((k) => cells([
        k, shown(data.pool[k], k, "pool"), ...models.map((m) => shown(data.models[m][k], k, m)),
      ], { "data-key": k })));
      const history = await api("GET", `/admin/policy/history?limit=${Math.min(ROWS_SHOWN, 100)}`);
      fill("policy-history", history.data.map((c) => cells([
        c.version, when(c.at), c.who, c.what,
      ], { "data-version": c.version })));
    },

    async audit() {
      const data = await api("GET", `/admin/audit?limit=${ROWS_SHOWN}`);
      fill("audit", data.data.map((e) => cells([
        when(e.ts), `${e.name} (${e.who})`, e.action, e.target, JSON.stringify(e.detail),
      ], { "data-action": e.action })));
    },
  };

  // A batch's output or error file, saved by the browser (a link could not send the key).
  async function download(id, part) {
    const r = await fetch(`/admin/batches/${encodeURIComponent(id)}/${part}`, {
      headers: { Authorization: "Bearer " + adminKey() },
    });
    if (!r.ok) throw new Error(`${part}: HTTP ${r.status}`);
    const link = el("a", undefined, {
      href: URL.createObjectURL(await r.blob()),
      download: `${id}-${part}.jsonl`,
    });
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
  }

  // --- a request's tokens, live over its event stream (fetch: it needs the header) ---

  const tokens = {
    id: null,
    kept: [],
    dropped: 0,
    last: "0-0",
    ended: false,

    start(id) {
      if (this.id !== null) return;
      this.id = id;
      this.read();
    },

    add(list) {
      this.kept.push(...list);
      const over = this.kept.length - TOKENS_SHOWN;
      if (over > 0) {
        this.kept.splice(0, over);
        this.dropped += over;
      }
    },

    draw() {
      $("tokens").textContent = this.kept.join("");
      $("tokens-more").hidden = this.dropped === 0;
      $("tokens-more").textContent = `${this.dropped} earlier tokens not shown`;
    },

    handle(kind, data) {
      if (kind === "tokens") this.add(data.tokens);
      if (kind === "done" || kind === "error") {
        this.ended = true;
        $("stream-state").textContent = `ended: ${data.finish_reason || kind}`;
        $("stream-state").dataset.ended = data.finish_reason || kind;
      }
    },

    async read() {
      while (!this.ended && adminKey()) {
        try {
          const r = await fetch(`/admin/requests/${encodeURIComponent(this.id)}/events`, {
            headers: { Authorization: "Bearer " + adminKey(), "Last-Event-ID": this.last },
          });
          if (!r.ok) throw new Error("HTTP " + r.status);
          $("stream-state").textContent = "streaming";
          const reader = r.body.getReader();
          const decoder = new TextDecoder();
          let buffered = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buffered += decoder.decode(value, { stream: true });
            const frames = buffered.split("\n\n");
            buffered = frames.pop();
            for (const frame of frames) this.frame(frame);
            this.draw();
          }
        } catch (e) {
          $("stream-state").textContent = "reconnecting: " + e.message;
        }
        if (!this.ended) await new Promise((done) => setTimeout(done, POLL_MS));
      }
    },

    frame(text) {
      let kind = "message";
      let data = "";
      for (const line of text.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
        else if (line.startsWith("id: ")) this.last = line.slice(4);
      }
      if (data) this.handle(kind, JSON.parse(data));
    },
  };

  // --- polling, forms, the key --------------------------------------------------------

  async function refresh() {
    if (!adminKey() || document.hidden) return;
    await views[PAGE]();
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  }

  async function tick() {
    try {
      await refresh();
    } catch (e) {
      if (!(e instanceof Refused)) showError(e.message);
    }
    setTimeout(tick, POLL_MS); // one call at a time: the next after this one
  }

  function open() {
    $("login").hidden = true;
    $("content").hidden = false;
    $("logout").hidden = false;
    showError("");
    tick();
  }

  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(STORE, $("admin-key").value.trim());
    $("admin-key").value = "";
    open();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(STORE);
    showLogin("");
  });

  onSubmit("filter", async () => {});
  onSubmit("new-tenant", (form) => api("POST", "/admin/tenants", formObject(form)));
  onSubmit("new-key", async (form) => {
    const made = await api("POST", "/admin/keys", formObject(form));
    $("new-key-value").textContent = made.key;
    $("new-key-shown").hidden = false;
    form.reset();
  });
  if ($("new-key-done")) {
    $("new-key-done").addEventListener("click", () => {
      $("new-key-value").textContent = "";
      $("new-key-shown").hidden = true;
    });
  }
  if ($("cancel")) {
    $("cancel").addEventListener("click", async () => {
      try {
        await api("POST", `/admin/requests/${encodeURIComponent(body.dataset.request)}/cancel`);
        await refresh();
      } catch (e) {
        if (!(e instanceof Refused)) showError(e.message);
      }
    });
  }

  if ($("policy-change")) {
    $("policy-change").addEventListener("submit", (event) => {
      event.preventDefault();
      const f = event.target.elements;
      changePolicy({ set: { [f.key.value]: typed(f.value.value.trim()) } });
    });
    $("policy-unset").addEventListener("click", () =>
      changePolicy({ unset: [$("policy-change").elements.key.value] }));
  }

  if (adminKey()) open();
  else showLogin("");
})();
