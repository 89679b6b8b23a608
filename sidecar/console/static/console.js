// The sidecar console: polls the daemon's /ui/api and renders it. Every value is set with textContent
// (never as markup); every request carries the session secret the sign-in page left in sessionStorage
// (this origin's only); the page itself holds none.
"use strict";

(() => {
  const secret = sessionStorage.getItem("sidecar-session");
  const POLL_MS = 1500;
  const views = ["connectors", "approvals", "sessions", "audit"];
  const shown = {}; // last rendered JSON per section: a section is redrawn only when it changed
  let auditTimer = null;

  async function api(method, path, body) {
    const init = { method, headers: { "X-Sidecar-Session": secret || "" }, credentials: "omit", cache: "no-store" };
    if (method !== "GET") {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body || {});
    }
    const response = await fetch("/ui/api/" + path, init);
    const data = await response.json().catch(() => null);
    if (response.status === 401) signedOut();
    if (!response.ok) {
      const why = data && data.error ? data.error.message : "HTTP " + response.status;
      throw new Error(why);
    }
    return data;
  }

  function el(tag, options, ...children) {
    const node = document.createElement(tag);
    const o = options || {};
    if (o.cls) node.className = o.cls;
    if (o.text !== undefined && o.text !== null) node.textContent = String(o.text);
    if (o.title) node.title = o.title;
    if (o.data) for (const [k, v] of Object.entries(o.data)) node.dataset[k] = v;
    if (o.onclick) node.addEventListener("click", o.onclick);
    if (tag === "button") node.type = "button";
    for (const child of children) if (child) node.append(child);
    return node;
  }

  function say(text, isError) {
    const box = document.getElementById("message");
    if (!box) return; // signed out: the page is the notice now
    box.textContent = text;
    box.className = isError ? "error" : "";
    box.hidden = !text;
  }

  async function act(what, method, path, body) {
    try {
      await api(method, path, body);
      say(what);
    } catch (err) {
      say(what + " failed: " + err.message, true);
    }
    await refresh();
  }

  function when(seconds) {
    return new Date(seconds * 1000).toLocaleString();
  }

  function duration(seconds) {
    const s = Math.floor(seconds);
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + (s % 60) + "s";
  }

  function changed(key, value) {
    const text = JSON.stringify(value);
    if (shown[key] === text) return false;
    shown[key] = text;
    return true;
  }

  function fill(id, rows, emptyId) {
    const body = document.getElementById(id);
    body.replaceChildren(...rows);
    if (emptyId) document.getElementById(emptyId).hidden = rows.length > 0;
  }

  // --- header -------------------------------------------------------------------------------------
  function renderStatus(status) {
    document.getElementById("version").textContent = status.version;
    document.getElementById("uptime").textContent = duration(status.uptime_seconds);
    const storage = status.storage.credentials + (status.storage.insecure ? " (insecure: key file)" : "");
    document.getElementById("storage").textContent = storage;
    const sandbox = document.getElementById("sandbox");
    sandbox.textContent = status.sandbox.available ? "connectors sandboxed" : "NONE: " + status.sandbox.reason;
    sandbox.classList.toggle("problem", !status.sandbox.available);
    document.getElementById("endpoint").textContent = status.url;
  }

  function renderProblems(data) {
    const all = [...data.connector_problems, ...data.status.billing_problems];
    if (data.status.trust_store_problem) all.push("trust store refused: " + data.status.trust_store_problem);
    const box = document.getElementById("problems");
    box.textContent = all.join(" · ");
    box.hidden = all.length === 0;
  }

  // --- connectors ---------------------------------------------------------------------------------
  // What a connector's sandbox shows it, as `sidecar connectors show` says it; "" for a remote one.
  function sandboxText(s) {
    if (!s) return "";
    if (s.mode === "off") return "UNSANDBOXED: runs as you, with your files (your mcp.json opts it out)";
    if (s.mode === "none") return "UNSANDBOXED (no sandbox here: " + s.why + ")";
    if (s.mode === "refused") return "requires a sandbox, and there is none here: it does not start (" + s.why + ")";
    const shown = ["workspace " + s.workspace];
    if (s.read_paths.length) shown.push("reads " + s.read_paths.join(", "));
    if (s.write_paths.length) shown.push("writes " + s.write_paths.join(", "));
    shown.push(s.network ? "the network" : "no network");
    if (s.abstract_sockets === "reachable") shown.push("and the host's abstract sockets (an X11 display, a D-Bus bus): this kernel cannot scope them");
    return "sandboxed: the system read-only, its own files, a private home and /tmp; " + shown.join("; ");
  }

  function connectorRow(c) {
    const state = el("td", {}, el("span", { cls: "state state-" + c.state, text: c.state }));
    const reason = c.error || c.config_problem;
    if (reason) state.append(el("div", { cls: "muted", text: reason }));
    if (c.auth && c.auth !== "none") {
      state.append(el("div", { cls: "muted", text: "sign-in: " + c.auth + (c.auth_reason ? " (" + c.auth_reason + ")" : "") }));
    }
    const tools = el("td");
    for (const t of c.tools) {
      tools.append(el("span", { cls: "tool" }, el("span", { cls: "risk risk-" + t.risk, text: t.risk }), el("code", { text: t.name })));
    }
    if (!c.tools.length) {
      const why = c.learning_tools ? "learning tools…" : c.state === "trusted" ? "none" : "learned when trusted";
      tools.append(el("span", { cls: "muted", text: why }));
    }
    const actions = el("td");
    if (c.state !== "trusted") {
      actions.append(el("button", { text: "Review trust", onclick: () => openTrust(c.id) }));
    }
    if (["trusted", "changed", "error"].includes(c.state)) {
      actions.append(el("button", { cls: "secondary", text: "Untrust", onclick: () => act("untrusted " + c.id, "POST", "connectors/" + c.id + "/untrust") }));
    }
    if (c.transport === "http" && c.state === "trusted") {
      actions.append(el("button", { cls: "secondary", text: "Connect", onclick: () => connect(c.id) }));
    }
    if (c.auth && !["none", "unauthorized"].includes(c.auth)) {
      actions.append(el("button", { cls: "danger", text: "Revoke", onclick: () => act("revoked " + c.id, "POST", "connectors/" + c.id + "/revoke") }));
    }
    return el(
      "tr",
      { data: { connector: c.id } },
      el("td", {}, el("strong", { text: c.id }), el("div", { cls: "muted", text: c.name })),
      el("td", {}, c.kind + " · " + c.transport + (c.network ? "" : " · offline"),
        c.sandbox ? el("div", { cls: c.sandbox.mode === "on" ? "muted" : "problem", text: c.sandbox.mode === "on" ? "sandboxed" : "unsandboxed" }) : ""),
      state,
      el("td", { text: String(c.connected_sessions) }),
      tools,
      actions,
    );
  }

  async function connect(id) {
    try {
      const flow = await api("POST", "connectors/" + id + "/connect");
      if (flow.browser_url) {
        // The daemon's start link binds the sign-in to this browser, then leads to the authorization server.
        window.open(flow.browser_url, "_blank", "noopener,noreferrer");
        say("sign-in to " + id + " opened in a new tab");
      } else {
        say(id + ": no sign-in needed (" + flow.auth + ")");
      }
    } catch (err) {
      say("connect " + id + " failed: " + err.message, true);
    }
  }

  async function openTrust(id) {
    const panel = document.getElementById("trust-panel");
    let c;
    try {
      c = await api("GET", "connectors/" + encodeURIComponent(id));
    } catch (err) {
      say("cannot show " + id + ": " + err.message, true);
      return;
    }
    const facts = el("dl");
    const add = (name, value) => {
      if (value === null || value === undefined || (Array.isArray(value) && !value.length)) return;
      facts.append(el("dt", { text: name }), el("dd", {}, el("code", { text: Array.isArray(value) ? value.join(" ") : String(value) })));
    };
    add("source", c.kind + ": " + c.origin);
    add("command", c.command);
    add("cwd", c.cwd);
    add("env keys", c.env_keys);
    add("url", c.url);
    add("OAuth client", c.oauth_client);
    add("sandbox", sandboxText(c.sandbox) || null);
    add("package digest", c.package_digest);
    add("trust key", c.trust_key);
    const tools = Object.entries(c.tool_risks || {}).map(([name, risk]) => name + " " + risk);
    add("declared risks", tools);
    const children = [el("h3", { text: "Trust " + c.id + "?" }), el("p", { text: c.sandbox && c.sandbox.mode === "on" ? "Trusting runs exactly this, as you, in a sandbox that shows it only what is listed:" : "Trusting runs exactly this, as you, with your files:" }), facts];
    if (c.state === "changed" || c.trusted_keys.some((k) => k.key !== c.trust_key)) {
      const was = c.trusted_keys.map((k) => k.key + " (trusted " + k.trusted_at + ")").join(", ");
      children.push(el("p", { cls: "problem", text: "Changed since you trusted it: its config or package files differ. Trusted before as " + was + "; it is now " + c.trust_key + "." }));
      if (c.changes && c.changes.length) {
        const list = el("ul");
        for (const change of c.changes) list.append(el("li", {}, el("code", { text: change })));
        children.push(list);
      }
    }
    children.push(
      el("button", { text: "Trust", onclick: async () => { panel.hidden = true; await act("trusted " + c.id, "POST", "connectors/" + c.id + "/trust"); } }),
      el("button", { cls: "secondary", text: "Cancel", onclick: () => { panel.hidden = true; } }),
    );
    panel.replaceChildren(...children);
    panel.hidden = false;
  }

  // --- approvals ----------------------------------------------------------------------------------
  function approvalRow(a) {
    const decision = el(
      "td",
      {},
      el("button", { text: "Allow once", onclick: () => act("allowed " + a.tool + " once", "POST", "approvals/" + a.approval_id + "/allow") }),
    );
    if (a.group) {
      decision.append(el("button", { cls: "secondary", text: "Allow for this session", onclick: () => act("allowed " + a.group + " for the session", "POST", "approvals/" + a.approval_id + "/allow", { remember: "session" }) }));
    }
    decision.append(el("button", { cls: "danger", text: "Deny", onclick: () => act("denied " + a.tool, "POST", "approvals/" + a.approval_id + "/deny") }));
    return el(
      "tr",
      { data: { approval: a.approval_id } },
      el("td", {}, el("code", { text: a.tool }), el("div", { cls: "muted mono", text: a.approval_id })),
      el("td", {}, a.risk ? el("span", { cls: "risk risk-" + a.risk, text: a.risk }) : null),
      el("td", { text: a.kind + (a.group ? " (" + a.group + ")" : "") }),
      el("td", {}, el("code", { text: a.session_id }), el("div", { cls: "muted", text: (a.project_id || "?") + (a.workspace ? " · " + a.workspace : "") })),
      el("td", {}, argumentList(a)),
      el("td", { text: when(a.expires_at) }),
      decision,
    );
  }

  // Each top-level argument on its own line, short values first, each bounded on its own: a long value
  // cannot push another argument out of view. "N more characters" fetches that approval whole.
  function argumentList(a) {
    const list = el("dl", { cls: "arguments" });
    if (!a.arguments.length) list.append(el("dd", { cls: "muted", text: "no arguments" }));
    a.arguments.forEach((arg, index) => {
      const value = el("code", { text: arg.value });
      const line = el("dd", {}, value);
      if (arg.more) {
        const reveal = el("button", { cls: "link", text: "… " + arg.more + " more characters" });
        reveal.addEventListener("click", async () => {
          try {
            const whole = await api("GET", "approvals/" + a.approval_id);
            value.textContent = whole.arguments[index].value;
            reveal.remove();
          } catch (err) {
            say("could not show the whole argument: " + err.message, true);
          }
        });
        line.append(reveal);
      }
      list.append(el("dt", { text: arg.name }), line);
    });
    return list;
  }

  // --- sessions -----------------------------------------------------------------------------------
  function sessionRow(s) {
    return el(
      "tr",
      { data: { session: s.session_id } },
      el("td", {}, el("strong", { text: s.label || "(no label)" }), el("div", {}, el("code", { cls: "muted", text: s.session_id }))),
      el("td", { text: s.client || "—" }),
      el("td", { text: s.project_id }),
      el("td", {}, el("code", { text: s.workspace })),
      el("td", { text: s.mode + (s.network ? "" : " · no network") }),
      el("td", {}, el("code", { text: s.allow.join(" ") })),
      el("td", { text: when(s.created_at) }),
      el("td", { text: s.last_used_at ? when(s.last_used_at) : "not since start" }),
      el("td", { text: when(s.expires_at) }),
      el("td", { text: String(s.clients) }),
      el("td", {}, el("button", { cls: "danger", text: "End", onclick: () => {
        // Ending is not undone: its clients' next call is refused, so ask first.
        const name = (s.label ? s.label + ", " : "") + s.session_id;
        const what = "End session " + name + " (project " + s.project_id + ")? Its clients' next call is refused.";
        if (window.confirm(what)) act("ended " + s.session_id, "POST", "sessions/" + s.session_id + "/end");
      } })),
    );
  }

  // --- audit --------------------------------------------------------------------------------------
  async function refreshAudit() {
    const query = new URLSearchParams({
      session: document.getElementById("audit-session").value.trim(),
      tool: document.getElementById("audit-tool").value.trim(),
    });
    let data;
    try {
      data = await api("GET", "audit?" + query.toString());
    } catch (err) {
      say("audit: " + err.message, true);
      return;
    }
    const verdict = document.getElementById("audit-verify");
    verdict.textContent = data.verify.ok
      ? "chain verified: " + data.verify.records + " records, intact"
      : "chain BROKEN (" + data.verify.records + " records): " + data.verify.problems.join("; ");
    verdict.className = data.verify.ok ? "verify-ok" : "verify-bad";
    if (!changed("audit", data.records)) return;
    fill(
      "audit",
      data.records.map((r) => {
        const rest = Object.entries(r)
          .filter(([k]) => !["ts", "event", "session", "tool", "seq"].includes(k))
          .map(([k, v]) => k + "=" + (typeof v === "string" ? v : JSON.stringify(v)))
          .join("  ");
        return el("tr", {}, el("td", { text: r.ts }), el("td", { text: r.event }), el("td", {}, el("code", { text: r.session || "" })), el("td", {}, el("code", { text: r.tool || "" })), el("td", { cls: "mono", text: rest }));
      }),
    );
  }

  // --- polling and navigation ---------------------------------------------------------------------
  async function refresh() {
    let data;
    try {
      data = await api("GET", "overview");
    } catch (err) {
      say("the daemon did not answer: " + err.message, true);
      return;
    }
    renderStatus(data.status);
    if (changed("problems", [data.connector_problems, data.status])) renderProblems(data);
    if (changed("connectors", data.connectors)) fill("connectors", data.connectors.map(connectorRow), "connectors-empty");
    if (changed("approvals", data.approvals)) fill("approvals", data.approvals.map(approvalRow), "approvals-empty");
    if (changed("sessions", data.sessions)) fill("sessions", data.sessions.map(sessionRow), "sessions-empty");
    const count = document.getElementById("approval-count");
    count.textContent = String(data.approvals.length);
    count.hidden = data.approvals.length === 0;
  }

  function showView() {
    const name = views.includes(location.hash.slice(1)) ? location.hash.slice(1) : "connectors";
    for (const v of views) document.getElementById("view-" + v).hidden = v !== name;
    for (const link of document.querySelectorAll("nav a")) link.classList.toggle("current", link.dataset.view === name);
    clearInterval(auditTimer);
    auditTimer = null;
    if (name === "audit") {
      refreshAudit();
      auditTimer = setInterval(refreshAudit, 2000);
    }
  }

  document.getElementById("audit-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    delete shown.audit;
    refreshAudit();
  });
  let poller = null;

  function signedOut() {
    // Not signed in, signed out, or idle too long: the secret is worthless now; say what to do.
    sessionStorage.removeItem("sidecar-session");
    clearInterval(poller);
    clearInterval(auditTimer);
    document.body.replaceChildren(
      el("main", { cls: "notice" },
        el("h1", { text: "sidecar console" }),
        el("p", { text: "You are not signed in. Run sidecar ui in a terminal: it opens this console with a one-time link." })));
  }

  document.getElementById("signout").addEventListener("click", async () => {
    await api("POST", "signout").catch(() => null);
    signedOut();
  });
  if (!secret) {
    signedOut();
    return;
  }
  window.addEventListener("hashchange", showView);
  showView();
  refresh();
  poller = setInterval(refresh, POLL_MS);
})();
