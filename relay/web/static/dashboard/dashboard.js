// The statecore dashboard page: one WebSocket to <prefix>/ws, JSON messages (relay/web/dashboard.py).
// Every text from the server is put in the page with textContent, never parsed as HTML.
"use strict";

// A reply's text, or a note that this dashboard does not show it (show_content is off).
function shownContent(row) {
  if (row.content_hidden) {
    return "(hidden)";
  }
  return row.content + (row.content_cut ? "…" : "");
}

// "1 reply keeps failing", "3 replies keep failing" (a lower bound when not every failed row
// was read).
function keepFailingText(n, exact) {
  const words = n === 1 ? "reply keeps failing" : "replies keep failing";
  return `${exact === false ? "at least " : ""}${n} ${words}`;
}

// One line of what a failed reply's last send said: its error kind, attempts and error.
function failureText(failure) {
  const error = failure.last_error + (failure.error_cut ? "…" : "");
  return `${failure.kind} · attempts ${failure.attempts} · ${error}`;
}

// A chat id cut for the table (the whole id is the cell's title).
function shortened(text, most) {
  const value = String(text === undefined || text === null ? "" : text);
  return value.length > most ? `${value.slice(0, most - 1)}…` : value;
}

(function () {
  const STREAM_ROWS = 200;
  const OBLIGATION_ROWS = 300;
  const CHAT_CHARS = 20;
  const $ = (id) => document.getElementById(id);

  let socket = null;
  let retryMs = 500;
  let clockSkew = 0; // server time - browser time, seconds
  let counts = [];
  let selected = null; // the obligation id whose history is shown
  let writable = false; // whether this dashboard has operator secrets
  let actions = {}; // obligation state -> the repairs its lifecycle allows (from the server)
  let catalog = []; // every kind of the store's catalog, drawn and counted (from the server)
  let catalogDrawn = ""; // the kinds and versions whose figures are drawn
  let kindSelected = null; // the kind whose rows are shown

  function cell(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    return node;
  }

  function time(at) {
    if (typeof at !== "number") return "";
    const d = new Date(at * 1000);
    const pad = (n, w) => String(n).padStart(w || 2, "0");
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }

  function age(seconds) {
    if (typeof seconds !== "number") return "-";
    if (seconds < 60) return `${Math.floor(seconds)} s`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
    if (seconds < 86400) return `${(seconds / 3600).toFixed(1)} h`;
    return `${(seconds / 86400).toFixed(1)} d`;
  }

  function note(text, kind) {
    const box = $("note");
    box.textContent = text;
    box.className = `note ${kind}`;
    box.dataset.kind = kind;
    box.hidden = false;
  }

  // -- counts -----------------------------------------------------------------------------------

  // The counts of each counted kind under its lifecycle's diagram.
  function renderDiagramCounts() {
    for (const k of counts) {
      const figure = document.querySelector(`#diagrams figure[data-kind="${CSS.escape(k.kind)}"]`);
      if (!figure) continue;
      const table = cell("table", null, { class: "counts" });
      const head = document.createElement("tr");
      const body = document.createElement("tr");
      for (const [state, n] of Object.entries(k.states)) {
        head.append(cell("th", state));
        body.append(cell("td", n, { class: n ? "count" : "count zero", "data-kind": k.kind, "data-state": state }));
      }
      table.append(head, body);
      let caption = figure.querySelector("figcaption");
      if (!caption) {
        caption = document.createElement("figcaption");
        figure.append(caption);
      }
      caption.replaceChildren(table);
    }
  }

  // The alarm near the counts: how many owed replies keep failing (nothing when none do).
  function renderFailing() {
    const badge = $("failing");
    const obligations = counts.find((k) => k.kind === "obligation");
    const n = (obligations && obligations.keep_failing) || 0;
    badge.dataset.count = String(n);
    badge.textContent = n ? keepFailingText(n, obligations.keep_failing_exact) : "";
    badge.hidden = n === 0;
  }

  function renderCounts() {
    renderDiagramCounts();
    renderFailing();
    const holder = $("counts");
    holder.replaceChildren();
    const now = Date.now() / 1000 + clockSkew;
    for (const k of counts) {
      const table = cell("table", null, { class: "counts", "data-kind": k.kind });
      const head = document.createElement("tr");
      const body = document.createElement("tr");
      head.append(cell("th", k.title, { class: "title" }));
      body.append(cell("td", k.kind, { class: "muted" }));
      for (const [state, n] of Object.entries(k.states)) {
        head.append(cell("th", state));
        body.append(cell("td", n, { class: n ? "count" : "count zero", "data-kind": k.kind, "data-state": state }));
      }
      head.append(cell("th", "owed"), cell("th", "oldest owed"));
      body.append(cell("td", k.owed, { class: "count", "data-kind": k.kind, "data-field": "owed" }));
      const oldest = typeof k.oldest_owed_at === "number" ? Math.max(0, now - k.oldest_owed_at) : null;
      body.append(cell("td", age(oldest), { "data-kind": k.kind, "data-field": "oldest" }));
      table.append(head, body);
      holder.append(table);
    }
  }

  function tickAges() {
    const now = Date.now() / 1000 + clockSkew;
    for (const k of counts) {
      const td = document.querySelector(`#counts td[data-kind="${CSS.escape(k.kind)}"][data-field="oldest"]`);
      const oldest = typeof k.oldest_owed_at === "number" ? Math.max(0, now - k.oldest_owed_at) : null;
      if (td) td.textContent = age(oldest);
    }
  }

  // -- rows -------------------------------------------------------------------------------------

  function obligationRow(row) {
    const tbody = $("obligations").tBodies[0];
    let tr = tbody.querySelector(`tr[data-id="${CSS.escape(row.id)}"]`);
    if (!tr) {
      tr = cell("tr", null, { class: "obligation", "data-id": row.id, tabindex: "0" });
      tbody.prepend(tr);
      while (tbody.rows.length > OBLIGATION_ROWS) tbody.deleteRow(-1);
    }
    tr.dataset.state = row.state;
    const keeps = Boolean(row.keeps_failing);
    tr.classList.toggle("keeps-failing", keeps);
    tr.dataset.keepsFailing = String(keeps);
    const state = cell("td", row.state, { class: "state", "data-state": row.state });
    const content = cell("td", null, { class: row.content_hidden ? "content hidden" : "content" });
    if (row.failure) {
      const waits = `waits for ${row.failure.waits_for}`;
      if (keeps) state.append(cell("span", "keeps failing", { class: "flag", title: waits }));
      const line = cell("div", failureText(row.failure), { class: "failure", title: waits });
      line.dataset.kind = row.failure.kind;
      content.append(line, cell("div", shownContent(row), { class: "text" }));
    } else {
      content.textContent = shownContent(row);
    }
    tr.replaceChildren(
      cell("td", row.id, { class: "id" }),
      state,
      cell("td", row.platform, { class: "platform" }),
      cell("td", shortened(row.chat_id, CHAT_CHARS), { class: "chat", title: row.chat_id }),
      content,
      cell("td", time(row.at), { class: "at" }),
    );
    if (row.id === selected) {
      $("detail-state").textContent = row.state;
      offerRepairs(row.state);
    }
  }

  function streamRow(change) {
    const tbody = $("stream").tBodies[0];
    const tr = cell("tr", null, { "data-kind": change.kind, "data-id": change.id, "data-state": change.state });
    if (change.kind === "obligation") tr.classList.add("obligation");
    tr.append(
      cell("td", time(change.at), { class: "at" }),
      cell("td", change.kind),
      cell("td", change.id, { class: "id" }),
      cell("td", change.event || ""),
      cell("td", change.from || ""),
      cell("td", change.state, { class: "state", "data-state": change.state }),
    );
    tbody.prepend(tr);
    while (tbody.rows.length > STREAM_ROWS) tbody.deleteRow(-1);
  }

  function change(c) {
    streamRow(c);
    if (c.kind === "obligation") obligationRow(c);
  }

  // Only the repairs the obligation lifecycle allows from `state` (none on a read-only
  // dashboard, or for an unknown row); the server refuses any other anyway.
  function offerRepairs(state) {
    const allowed = (writable && state && actions[state]) || [];
    for (const button of document.querySelectorAll("#actions button[data-action]")) {
      button.hidden = !allowed.includes(button.dataset.action);
    }
    $("reason").hidden = allowed.length === 0;
    $("actions").hidden = !writable;
  }

  // -- one obligation -----------------------------------------------------------------------------

  // What the selected reply's last send said and what it waits for (hidden unless it failed).
  function showFailure(row) {
    const box = $("detail-failure");
    const failure = row && row.failure;
    box.hidden = !failure;
    box.replaceChildren();
    if (!failure) {
      box.dataset.keepsFailing = "false";
      return;
    }
    box.dataset.keepsFailing = String(Boolean(failure.keeps_failing));
    const head = failure.keeps_failing ? "keeps failing" : "failed";
    box.append(
      cell("strong", head, { class: failure.keeps_failing ? "flag" : "" }),
      cell("span", ` ${failureText(failure)}`, { class: "failure-error" }),
      cell("br"),
      cell("span", `waits for ${failure.waits_for}`, { class: "waits" }),
    );
    if (typeof failure.retry_at === "number") {
      box.append(cell("span", ` (retry at ${time(failure.retry_at)})`, { class: "muted" }));
    }
  }

  function showHistory(msg) {
    const detail = $("detail");
    detail.hidden = false;
    detail.dataset.id = msg.id;
    $("detail-id").textContent = msg.id;
    const tbody = $("history").tBodies[0];
    tbody.replaceChildren();
    if (!msg.found) {
      $("detail-state").textContent = "unknown";
      $("detail-state").dataset.state = "";
      $("detail-content").textContent = "no such obligation (pruned, or never recorded)";
      showFailure(null);
      offerRepairs(null);
      return;
    }
    showFailure(msg.row);
    $("detail-state").textContent = msg.row.state;
    $("detail-state").dataset.state = msg.row.state;
    offerRepairs(msg.row.state);
    $("detail-content").textContent = shownContent(msg.row);
    for (const r of msg.records) {
      const tr = cell("tr", null, { "data-event": r.event });
      tbody.append(tr);
      tr.append(
        cell("td", r.from || "(new)"),
        cell("td", r.to),
        cell("td", r.event),
        cell("td", time(r.at)),
        cell("td", r.owner || ""),
        cell("td", r.attempts === null ? "" : r.attempts),
        cell("td", r.reason || ""),
      );
    }
  }

  function select(id) {
    selected = id;
    ask({ type: "history", id });
  }

  function act(action) {
    if (!selected) return;
    const reason = $("reason").value.trim();
    if (!reason) {
      note(`${action}: type a reason first (it goes into the audit entry)`, "refused");
      return;
    }
    ask({ type: action, id: selected, reason, token: $("token").value.trim() });
  }

  // -- every kind of the store's catalog ---------------------------------------------------------

  function countsTable(kind, states) {
    const table = cell("table", null, { class: "counts" });
    const head = document.createElement("tr");
    const body = document.createElement("tr");
    for (const [state, n] of Object.entries(states)) {
      head.append(cell("th", state));
      body.append(cell("td", n, { class: n ? "count" : "count zero", "data-catalog-kind": kind, "data-state": state }));
    }
    table.append(head, body);
    return table;
  }

  function timersTable(timers) {
    const table = cell("table", null, { class: "counts timers" });
    const head = document.createElement("tr");
    for (const h of ["timer", "from", "to", "after", "running", "due now", "next due"]) head.append(cell("th", h));
    table.append(head);
    for (const t of timers) {
      const tr = cell("tr", null, { "data-timer": t.event });
      const after = typeof t.after === "number" ? `${t.after} s` : t.after;
      const due = t.due === null ? "-" : `${t.due}${t.due_exact ? "" : "+"}`;
      for (const v of [t.event, t.from, t.to, after, t.running, due, t.next_due_at === null ? "-" : time(t.next_due_at)]) {
        tr.append(cell("td", v));
      }
      table.append(tr);
    }
    return table;
  }

  function renderCatalog() {
    const holder = $("kinds");
    const drawn = catalog.map((k) => `${k.kind}@${k.version}`).join(" ");
    if (drawn !== catalogDrawn) {
      holder.replaceChildren();
      for (const k of catalog) {
        const figure = cell("figure", null, { "data-kind": k.kind });
        const img = cell("img", null, { alt: `lifecycle ${k.lifecycle} of ${k.kind}` });
        img.src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(k.svg || "")}`;
        figure.append(img, document.createElement("figcaption"));
        holder.append(figure);
      }
      catalogDrawn = drawn;
    }
    for (const k of catalog) {
      const figure = holder.querySelector(`figure[data-kind="${CSS.escape(k.kind)}"]`);
      if (!figure) continue;
      figure.dataset.selected = String(k.kind === kindSelected);
      const caption = figure.querySelector("figcaption");
      const title = cell("h3", `${k.kind} `);
      title.append(cell("span", `lifecycle ${k.lifecycle} v${k.version}${k.builtin ? ", built in" : ""}`, { class: "muted" }));
      const parts = [title];
      if (!k.readable) parts.push(cell("p", "not readable by this dashboard", { class: "muted" }));
      else {
        parts.push(countsTable(k.kind, k.counts));
        if (k.timers.length) parts.push(timersTable(k.timers));
        parts.push(cell("button", "rows", { type: "button", "data-kind": k.kind }));
      }
      caption.replaceChildren(...parts);
    }
  }

  function askRows(kind, state) {
    ask({ type: "kind_rows", kind, state: state || null });
  }

  function showKindRows(msg) {
    kindSelected = msg.kind;
    $("kind-detail").hidden = false;
    $("kind-name").textContent = msg.kind;
    const known = catalog.find((k) => k.kind === msg.kind);
    const select = $("kind-state");
    select.replaceChildren(cell("option", "every state", { value: "" }));
    for (const state of (known && known.states) || []) select.append(cell("option", state, { value: state }));
    select.value = msg.state || "";
    const body = $("kind-rows").tBodies[0];
    body.replaceChildren();
    if (!msg.found) {
      $("kind-total").textContent = `${msg.reason}; known: ${msg.known.join(", ")}`;
      return;
    }
    $("kind-total").textContent = `${msg.rows.length} of ${msg.total} shown`;
    for (const row of msg.rows) {
      const tr = cell("tr", null, { class: "kind-row", "data-id": row.id, tabindex: "0" });
      const values = row.values === null ? "(withheld: a built-in kind)" : JSON.stringify(row.values);
      tr.append(cell("td", row.id, { class: "id" }), cell("td", row.state, { class: "state" }), cell("td", row.fence), cell("td", values, { class: "values" }));
      body.append(tr);
    }
    renderCatalog();
  }

  function showKindHistory(msg) {
    $("kind-row").hidden = false;
    $("kind-row-id").textContent = msg.id;
    $("kind-row-state").textContent = msg.found ? (msg.row ? msg.row.state : "gone") : "not found";
    const body = $("kind-history").tBodies[0];
    body.replaceChildren();
    for (const r of msg.records) {
      const tr = document.createElement("tr");
      for (const v of [r.from, r.to, r.event, time(r.at), r.owner, r.reason]) tr.append(cell("td", v));
      body.append(tr);
    }
  }

  // -- the socket ---------------------------------------------------------------------------------

  function ask(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
    else note("not connected: the request was not sent", "refused");
  }

  const handlers = {
    hello(msg) {
      clockSkew = msg.now - Date.now() / 1000;
      $("store").textContent = msg.store;
      writable = Boolean(msg.writable);
      actions = msg.actions || {};
      // No token can do anything here: no token box, no repairs.
      $("token-box").hidden = !writable;
      $("actions").hidden = !writable;
      if (!writable) setMode(null, "read-only: no operator secrets");
      const diagrams = $("diagrams");
      diagrams.replaceChildren();
      for (const d of msg.diagrams) {
        const figure = cell("figure", null, { "data-lifecycle": d.lifecycle });
        if (d.kind) figure.dataset.kind = d.kind;
        const img = cell("img", null, { alt: `lifecycle ${d.lifecycle}` });
        img.src = `data:image/svg+xml;charset=utf-8,${encodeURIComponent(d.svg)}`;
        figure.append(img);
        diagrams.append(figure);
      }
      counts = msg.counts;
      renderCounts();
      catalog = msg.catalog || [];
      catalogDrawn = "";
      renderCatalog();
      if (kindSelected) askRows(kindSelected, $("kind-state").value);
      $("obligations").tBodies[0].replaceChildren();
      $("stream").tBodies[0].replaceChildren();
      for (const c of msg.recent) streamRow(c);
      // Each obligation once, as it is now (the owed and latest rows are read as they are;
      // the recent changes may be older), the latest change on top.
      const rows = new Map();
      for (const c of msg.recent) if (c.kind === "obligation") rows.set(c.id, c);
      for (const row of [...msg.obligations, ...(msg.latest || [])]) rows.set(row.id, row);
      const ordered = [...rows.values()].sort((a, b) => a.at - b.at);
      for (const row of ordered) obligationRow(row);
      if (selected) select(selected);
      else offerRepairs(null);
    },
    changes(msg) {
      for (const c of msg.changes) change(c);
      if (selected && msg.changes.some((c) => c.kind === "obligation" && c.id === selected)) {
        ask({ type: "history", id: selected });
      }
    },
    counts(msg) {
      clockSkew = msg.now - Date.now() / 1000;
      counts = msg.counts;
      renderCounts();
      if (msg.catalog) {
        catalog = msg.catalog;
        renderCatalog();
      }
    },
    history: showHistory,
    kind_rows: showKindRows,
    kind_history: showKindHistory,
    auth(msg) {
      setMode(msg.operator, msg.reason);
    },
    done(msg) {
      note(`${msg.action} by ${msg.operator}: ${msg.message}`, "done");
      if (msg.id === selected) ask({ type: "history", id: selected });
    },
    refused(msg) {
      note(`${msg.action} of ${msg.id} refused: ${msg.reason}`, "refused");
    },
    error(msg) {
      note(`error: ${msg.error}`, "refused");
    },
  };

  function setMode(operator, reason) {
    const mode = $("mode");
    mode.dataset.mode = operator ? "operator" : "read-only";
    mode.textContent = operator ? `operator ${operator}` : reason || "read-only";
  }

  function connect() {
    const url = new URL("ws", window.location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    setConnection("connecting");
    socket = new WebSocket(url);
    socket.addEventListener("open", () => {
      retryMs = 500;
      setConnection("live");
      const token = $("token").value.trim();
      if (token) ask({ type: "auth", token });
    });
    socket.addEventListener("message", (event) => {
      let msg;
      try {
        msg = JSON.parse(event.data);
      } catch (_) {
        return;
      }
      const handler = handlers[msg && msg.type];
      if (handler) handler(msg);
    });
    socket.addEventListener("close", () => {
      setConnection("disconnected");
      socket = null;
      window.setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    });
  }

  function setConnection(status) {
    const badge = $("connection");
    badge.dataset.status = status;
    badge.textContent = status;
  }

  function clickedRow(event) {
    const tr = event.target.closest("tr.obligation");
    if (tr && tr.dataset.id) select(tr.dataset.id);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("obligations").addEventListener("click", clickedRow);
    $("stream").addEventListener("click", clickedRow);
    $("obligations").addEventListener("keydown", (event) => {
      if (event.key === "Enter") clickedRow(event);
    });
    $("auth").addEventListener("submit", (event) => {
      event.preventDefault();
      ask({ type: "auth", token: $("token").value.trim() });
    });
    $("lookup").addEventListener("submit", (event) => {
      event.preventDefault();
      const id = $("lookup-id").value.trim();
      if (id) select(id);
      else note("find by id: type an obligation id first", "refused");
    });
    $("actions").addEventListener("submit", (event) => event.preventDefault());
    for (const button of document.querySelectorAll("#actions button[data-action]")) {
      button.addEventListener("click", () => act(button.dataset.action));
    }
    $("kinds").addEventListener("click", (event) => {
      const button = event.target.closest("button[data-kind]");
      if (button) askRows(button.dataset.kind, "");
    });
    $("kind-state").addEventListener("change", () => askRows(kindSelected, $("kind-state").value));
    const pickKindRow = (event) => {
      const tr = event.target.closest("tr.kind-row");
      if (tr && tr.dataset.id) ask({ type: "kind_history", kind: kindSelected, id: tr.dataset.id });
    };
    $("kind-rows").addEventListener("click", pickKindRow);
    $("kind-rows").addEventListener("keydown", (event) => {
      if (event.key === "Enter") pickKindRow(event);
    });
    window.setInterval(tickAges, 1000); // the oldest owed ages keep growing
    connect();
  });
})();
