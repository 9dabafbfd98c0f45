// The dashboard: one page, a view per hash (#clients, ...), each refreshed every second
// from the broker's /api/v5 endpoints with the login's token. Data from clients (IDs,
// topics, payloads, user properties) is only ever inserted as text (`el`, textContent),
// never as markup.

import { LineChart, formatRate } from "/dashboard/chart.js";
import { MqttClient } from "/dashboard/mqtt.js";

const REFRESH_MS = 1000;
const $ = (id) => document.getElementById(id);
let token = localStorage.getItem("token");
let role = null;
let current = null;  // the view shown

// ---- helpers ----------------------------------------------------------------------------
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  }
  return node;
}

// What each table shows now, so a refresh that changes nothing leaves the rows (and a
// click or a selection in them) alone.
const shown = new WeakMap();

function table(target, headers, rows) {
  const head = el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h))));
  const body = el("tbody", {}, ...(rows.length ? rows
    : [el("tr", {}, el("td", { colspan: headers.length }, "nothing here"))]));
  const node = typeof target === "string" ? $(target) : target;
  const markup = head.outerHTML + body.outerHTML;
  if (shown.get(node) === markup) return;
  shown.set(node, markup);
  node.replaceChildren(head, body);
}

function cell(value, cls) {
  return el("td", cls ? { class: cls } : {}, value);
}

function notice(text, isError = false) {
  $("notice").textContent = text;
  $("notice").className = isError ? "error" : "";
}

function duration(seconds) {
  if (seconds == null) return "never";
  const s = Math.max(0, Math.round(seconds));
  const parts = [[86400, "d"], [3600, "h"], [60, "m"], [1, "s"]];
  for (const [size, unit] of parts) {
    if (s >= size || unit === "s") {
      const rest = s % size;
      const next = parts.find(([n]) => n < size);
      return `${Math.floor(s / size)}${unit}` + (next && rest >= next[0]
        ? ` ${Math.floor(rest / next[0])}${next[1]}` : "");
    }
  }
  return "";
}

function bytes(n) {
  for (const unit of ["B", "KB", "MB", "GB"]) {
    if (n < 1024 || unit === "GB") return `${n.toFixed(unit === "B" ? 0 : 1)} ${unit}`;
    n /= 1024;
  }
  return "";
}

function when(microseconds) {
  return microseconds ? new Date(microseconds / 1000).toLocaleString() : "";
}

function clientLink(id) {
  return el("button", { class: "link", onclick: () => showClient(id) }, id);
}

class Unauthorized extends Error {}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) {
    loggedOut("Your login expired: log in again.");
    throw new Unauthorized();
  }
  const text = await response.text();
  const json = (response.headers.get("Content-Type") || "").includes("json");
  const data = json && text ? JSON.parse(text) : null;
  if (!response.ok) throw new Error(data?.message || `${method} ${path}: ${response.status}`);
  return data;
}

// ---- login ------------------------------------------------------------------------------
function loggedOut(message = "") {
  token = null;
  localStorage.removeItem("token");
  $("app").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message;
}

async function loggedIn() {
  try {
    role = (await api("GET", "/api/v5/me")).role;
  } catch (error) {
    if (!(error instanceof Unauthorized)) loggedOut(error.message);
    return;
  }
  $("who").textContent = role;
  for (const button of document.querySelectorAll(".admin")) button.hidden = role !== "administrator";
  $("login").hidden = true;
  $("app").hidden = false;
  route();
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = new FormData(event.target);
  const response = await fetch("/api/v5/login", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ username: form.get("username"), password: form.get("password") }),
  });
  const data = await response.json();
  if (!response.ok) {
    $("login-error").textContent = response.status === 401
      ? "Wrong user name or password." : data.message;
    return;
  }
  token = data.token;
  localStorage.setItem("token", token);
  event.target.reset();
  loggedIn();
});

$("logout").addEventListener("click", async () => {
  await fetch("/api/v5/logout", { method: "POST", headers: { Authorization: `Bearer ${token}` } });
  loggedOut("Logged out.");
});

// ---- overview ---------------------------------------------------------------------------
const chart = new LineChart($("rates"), [
  { label: "in", color: "#2f6fdb" }, { label: "out", color: "#1b9e5a" },
]);
let previous = null;
let lastMonitor = null;

async function sample() {
  const now = await api("GET", "/api/v5/monitor_current");
  if (previous) {
    const dt = Math.max(0.001, now.time - previous.time);
    chart.push([(now.received - previous.received) / dt, (now.sent - previous.sent) / dt]);
  }
  previous = lastMonitor = now;
}

// Every member of the cluster as this node sees it (a node that does not answer is listed
// as stopped); connections and sessions are the cluster's, the other cards this node's.
async function overview() {
  const m = lastMonitor;
  if (!m) return;
  const nodes = await api("GET", "/api/v5/nodes");
  const up = nodes.filter((n) => n.node_status === "running");
  const total = (field) => up.reduce((sum, n) => sum + (n[field] ?? 0), 0);
  const cards = [
    ["Nodes", `${up.length} of ${nodes.length} up`], ["Connections", total("live_connections")],
    ["Sessions", total("connections")],
    ["Durable online", m.durable_sessions_online], ["Durable offline", m.durable_sessions_offline],
    ["Subscriptions", m.subscriptions], ["Retained", m.retained_msg_count],
    ["In flight", m.inflight],
  ];
  $("cards").replaceChildren(...cards.map(([label, value]) => el("div", { class: "card" },
    el("div", { class: "value", "data-card": label }, value), el("div", { class: "label" }, label))));
  $("this-node").textContent = m.node;
  table("nodes", ["Node", "Site", "State", "Joined", "Version", "Uptime", "Connections",
    "Sessions"], nodes.map((n) => el("tr", { "data-node": n.node }, cell(n.node, "id"),
    cell(n.site, "id"), cell(n.node_status === "running" ? "up" : "down",
      n.node_status === "running" ? "online" : "offline"),
    cell(n.joined ? "joined" : "not joined", "joined"), cell(n.version),
    cell(n.uptime == null ? "" : duration(n.uptime / 1000)), cell(n.live_connections),
    cell(n.connections))));
  table("dropped", ["Reason", "Dropped"], Object.entries(m.dropped_by_reason)
    .map(([reason, count]) => el("tr", {}, cell(reason), cell(count))));
  chart.draw();
}

// ---- clients ----------------------------------------------------------------------------
let pendingKick = null;
let shownClient = null;

// A session as /api/v5/clients lists it, for a durable one whose node is down: only the
// replicated sessions database knows it, and it waits for its client on any node.
function unservedClient(d) {
  return { clientid: d.clientid, node: d.node, connected: false, proto_ver: null,
    durable: true, inflight_cnt: "", subscriptions_cnt: d.subscriptions_cnt, unserved: true };
}

async function clients() {
  const [all, durable] = await Promise.all([
    api("GET", "/api/v5/clients?limit=1000"),
    api("GET", "/api/v5/durable_sessions?connected=false&cluster=true&limit=200"),
  ]);
  const key = (c) => `${c.node}\u0000${c.clientid}`;
  const offline = new Map(durable.data.map((d) => [key(d), d]));
  const listed = all.data.concat(durable.data.filter((d) => !d.served).map(unservedClient))
    .sort((a, b) => (a.clientid < b.clientid ? -1 : a.clientid > b.clientid ? 1 : 0));
  const filter = $("client-filter").value;
  const rows = listed.filter((c) => c.clientid.includes(filter)).map((c) => {
    const d = offline.get(key(c));
    const expires = d ? (d.expires_at == null ? "never" : duration(d.expires_at - d.now))
      : c.connected ? "" : `${c.expiry_interval}s after disconnect`;
    const missed = d ? `${d.missed_cnt ?? "?"}${d.missed_capped ? "+" : ""}` : "";
    const kick = el("button", {
      class: "danger",
      onclick: () => kickClient(c.clientid),
    }, pendingKick === c.clientid ? "Confirm kick" : "Kick");
    kick.hidden = role !== "administrator";
    return el("tr", { "data-clientid": c.clientid },
      el("td", { class: "id" }, clientLink(c.clientid)), cell(c.node),
      cell(c.connected ? "connected" : c.unserved ? "offline, node down" : "offline",
        c.connected ? "online" : "offline"),
      cell(c.proto_ver === 5 ? "MQTT 5.0" : c.proto_ver === 4 ? "MQTT 3.1.1" :
        d ? (d.proto_ver === 5 ? "MQTT 5.0" : "MQTT 3.1.1") : ""),
      cell(c.durable ? "durable" : "memory"), cell(expires, "expires"),
      cell(c.inflight_cnt, "inflight"), cell(missed, "missed"), cell(c.subscriptions_cnt),
      el("td", {}, kick));
  });
  table("clients", ["Client ID", "Node", "State", "Protocol", "Session", "Expires in",
    "In flight", "Missed", "Subs", ""], rows);
  $("client-count").textContent = all.meta.count > all.data.length
    ? `${all.meta.count} sessions, the first ${all.data.length} by client ID listed`
    : `${all.meta.count} sessions`;
  if (shownClient !== null) await clientSubscriptions();
}

async function kickClient(id) {
  if (pendingKick !== id) {
    pendingKick = id;
    return clients();
  }
  pendingKick = null;
  try {
    await api("DELETE", `/api/v5/clients/${encodeURIComponent(id)}`);
    notice(`Kicked ${id}.`);
  } catch (error) {
    notice(error.message, true);
  }
  return clients();
}

function showClient(id) {
  shownClient = id;
  $("client-detail").hidden = false;
  $("client-detail-id").textContent = id;
  clientSubscriptions();
}

async function clientSubscriptions() {
  let subs;
  try {
    subs = await api("GET", `/api/v5/clients/${encodeURIComponent(shownClient)}/subscriptions`);
  } catch (error) {
    if (error instanceof Unauthorized) throw error;
    subs = [];
  }
  table("client-subscriptions", ["Topic", "QoS", "No local", "Retain as published",
    "Retain handling", "Node"], subs.map((s) => el("tr", {}, cell(s.topic, "id"), cell(s.qos),
    cell(s.nl), cell(s.rap), cell(s.rh), cell(s.node))));
}

$("client-filter").addEventListener("input", () => clients());

// ---- subscriptions ----------------------------------------------------------------------
async function subscriptions() {
  const all = await api("GET", "/api/v5/subscriptions?limit=1000");
  const filter = $("subscription-filter").value;
  table("subscriptions", ["Client ID", "Topic", "QoS", "Shared group", "Node"],
    all.data.filter((s) => s.clientid.includes(filter) || s.topic.includes(filter))
      .map((s) => el("tr", {}, el("td", { class: "id" }, s.clientid), cell(s.topic, "id"),
        cell(s.qos), cell(s.share_group ?? ""), cell(s.node))));
}

$("subscription-filter").addEventListener("input", () => subscriptions());

// ---- durable shared groups --------------------------------------------------------------
// GET /api/v5/durable_shared_groups answers for the whole cluster on any node: each group of
// `$share/GROUP/FILTER` subscriptions of durable sessions, its members (with the site of the
// node holding each session and the shards it reads) and its backlog, per stream too. A
// group's block is kept between refreshes (its tables redrawn only when their rows change).
const groupBlocks = new Map();  // group + "\u0000" + filter -> { block, members, streams }

function groupBlock(g, key) {
  let found = groupBlocks.get(key);
  if (!found) {
    const members = el("table", { class: "group-members" });
    const streams = el("table", { class: "group-streams" });
    const title = el("h2", {});
    found = {
      title, members, streams,
      block: el("div", { class: "group", "data-group": g.group, "data-filter": g.filter },
        title, el("div", { class: "scroll" }, members), el("div", { class: "scroll" }, streams)),
    };
    groupBlocks.set(key, found);
  }
  return found;
}

async function groups() {
  let all, nodes;
  try {
    [all, nodes] = await Promise.all([
      api("GET", "/api/v5/durable_shared_groups"), api("GET", "/api/v5/nodes"),
    ]);
  } catch (error) {
    if (error instanceof Unauthorized) throw error;
    $("groups-summary").textContent = error.message;
    table("groups", ["Group", "Filter", "Members", "Backlog", "Nodes", "Since"], []);
    groupBlocks.clear();
    $("groups-detail").replaceChildren();
    return;
  }
  // A member's `node` is the site of the node holding its session; a node's name is taken
  // too. Both shown, as the Overview's nodes table has them.
  const known = new Map(nodes.flatMap((n) => [[n.site, n], [n.node, n]]));
  const nodeOf = (where) => known.get(where)?.node ?? where ?? "";
  const siteOf = (where) => known.get(where)?.site ?? where ?? "";
  const list = [...all.data].sort((a, b) =>
    a.group.localeCompare(b.group) || a.filter.localeCompare(b.filter));
  const count = all.meta?.count ?? list.length;
  $("groups-summary").textContent = count > list.length
    ? `${count} groups, the first ${list.length} listed` : `${count} group${count === 1 ? "" : "s"}`;
  table("groups", ["Group", "Filter", "Members", "Backlog", "Nodes", "Since"], list.map((g) => {
    const members = g.members ?? [];
    const connected = members.filter((m) => m.connected).length;
    const where = [...new Set(members.map((m) => nodeOf(m.node)).filter(Boolean))].sort();
    return el("tr", { "data-group": g.group, "data-filter": g.filter },
      cell(g.group, "id"), cell(g.filter, "id"),
      cell(`${connected} of ${members.length} connected`,
        connected ? "members online" : "members offline"),
      cell(g.backlog ?? "", "backlog"), cell(where.join(", "), "id"),
      cell(when(g.since)));
  }));
  const keys = new Set();
  const blocks = list.map((g) => {
    const key = `${g.group}\u0000${g.filter}`;
    keys.add(key);
    const { block, title, members, streams } = groupBlock(g, key);
    title.textContent = `Group ${g.group} on ${g.filter}`;
    table(members, ["Member", "Node", "Site", "State", "Shards"], (g.members ?? [])
      .slice().sort((a, b) => a.clientid.localeCompare(b.clientid))
      .map((m) => el("tr", { "data-member": m.clientid }, cell(m.clientid, "id"),
        cell(nodeOf(m.node), "id"), cell(siteOf(m.node), "id"),
        cell(m.connected ? "connected" : "disconnected", m.connected ? "online" : "offline"),
        cell((m.shards ?? []).join(", "), "shards"))));
    // Owner: the member reading that shard for the group; one that is not connected (the
    // last to read it, kept while no member is connected) reads nothing now.
    const online = new Set((g.members ?? []).filter((m) => m.connected).map((m) => m.clientid));
    const owner = (id) => id == null ? cell("none", "owner offline")
      : online.has(id) ? cell(id, "owner id") : cell(`${id} (disconnected)`, "owner id offline");
    table(streams, ["Shard", "Generation", "Stream", "Owner", "Backlog"], (g.streams ?? [])
      .map((s) => el("tr", { "data-shard": s.shard, "data-stream": s.stream },
        cell(s.shard), cell(s.generation), cell(s.stream), owner(s.owner),
        cell(s.backlog, "backlog"))));
    return block;
  });
  for (const key of [...groupBlocks.keys()]) if (!keys.has(key)) groupBlocks.delete(key);
  const detail = $("groups-detail");
  if (blocks.length !== detail.children.length
      || blocks.some((block, i) => detail.children[i] !== block)) {
    detail.replaceChildren(...blocks);
  }
}

// ---- topics (retained) ------------------------------------------------------------------
function retainedPath(topic) {
  return `/api/v5/mqtt/retainer/message/${encodeURIComponent(topic)}`;
}

async function topics() {
  const all = await api("GET", "/api/v5/mqtt/retainer/messages?limit=1000");
  table("retained", ["Topic", "QoS", "From", "Size", "Expires", ""], all.data.map((m) => {
    const remove = el("button", { class: "danger", onclick: () => deleteRetained(m.topic) },
      "Delete");
    remove.hidden = role !== "administrator";
    return el("tr", { "data-topic": m.topic }, cell(m.topic, "id"), cell(m.qos),
      cell(m.from_clientid, "id"), cell(bytes(m.payload_size)),
      cell(m.expires_at ? new Date(m.expires_at * 1000).toLocaleString() : "never"),
      el("td", {}, el("button", { onclick: () => viewRetained(m.topic) }, "View"), " ", remove));
  }));
}

async function viewRetained(topic) {
  try {
    const message = await api("GET", retainedPath(topic));
    const raw = Uint8Array.from(atob(message.payload), (c) => c.charCodeAt(0));
    let text;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(raw);
    } catch {
      text = [...raw].map((b) => b.toString(16).padStart(2, "0")).join(" ") + "  (hex)";
    }
    $("retained-detail").hidden = false;
    $("retained-detail-topic").textContent = topic;
    $("retained-payload").textContent = text;
    table("retained-properties", ["User property", "Value"],
      message.user_properties.map(([k, v]) => el("tr", {}, cell(k, "id"), cell(v, "id"))));
  } catch (error) {
    if (!(error instanceof Unauthorized)) notice(error.message, true);
  }
}

async function deleteRetained(topic) {
  try {
    await api("DELETE", retainedPath(topic));
    notice(`Deleted the retained message of ${topic}.`);
    $("retained-detail").hidden = true;
  } catch (error) {
    if (!(error instanceof Unauthorized)) notice(error.message, true);
  }
  return topics();
}

// ---- durable storage --------------------------------------------------------------------
async function storage() {
  let info;
  try {
    info = await api("GET", "/api/v5/ds/storages");
  } catch (error) {
    if (error instanceof Unauthorized) throw error;
    $("storage-summary").textContent = error.message;
    return;
  }
  $("storage-summary").textContent = `Site ${info.site_id}`;
  const head = ["Shard", "Generation", "State", "Created", "Sealed", "Messages' time range",
    "Messages", "Size", "Streams"];
  $("storage").replaceChildren(...info.databases.map((db) => {
    const title = el("h2", {}, `Database ${db.name}`);
    if (!db.shards) {  // the sessions database: one LevelDB, no generations
      return el("div", {}, title, el("p", {}, `about ${db.bytes} bytes on disk, ${db.commits} commits`));
    }
    title.append(` (${db.n_shards} shards, replication factor ${db.replication_factor})`);
    const rows = db.shards.flatMap((shard) => shard.generations.map((g) =>
      el("tr", {}, cell(shard.shard), cell(g.generation), cell(g.state, g.state),
        cell(when(g.since)), cell(g.until ? when(g.until) : "open"),
        cell(g.messages ? `${when(g.min_timestamp)} – ${when(g.max_timestamp)}` : "empty"),
        cell(g.messages), cell(bytes(g.bytes)), cell(g.streams))));
    const generations = el("table", { id: `db-${db.name}` });
    table(generations, head, rows);
    return el("div", {}, title, el("div", { class: "scroll" }, generations));
  }), await sites());
}

// Replica placement: EMQX's /api/v5/ds/sites, served with replicated storage only (a 404
// otherwise: every shard is then on its own node's disk, and nothing is shown).
async function sites() {
  let placement;
  try {
    const ids = await api("GET", "/api/v5/ds/sites");
    placement = await Promise.all(ids.map((id) =>
      api("GET", `/api/v5/ds/sites/${encodeURIComponent(id)}`)));
  } catch (error) {
    if (error instanceof Unauthorized) throw error;
    return "";
  }
  const held = (site) => site.shards.map((s) =>
    `${s.storage} ${s.id}${s.transition ? ` (${s.transition})` : ""}`).join(", ");
  const placed = el("table", { id: "sites" });
  table(placed, ["Site", "Node", "State", "Replicas it holds"], placement.map((site) =>
    el("tr", { "data-site": site.site }, cell(site.site, "id"), cell(site.node, "id"),
      cell(site.up ? "up" : "down", site.up ? "online" : "offline"), cell(held(site), "id"))));
  const names = new Map(placement.map((site) => [site.site, site.node]));
  return el("div", {}, el("h2", {}, "Sites and replica placement"),
    el("div", { class: "scroll" }, placed), await shards(names));
}

// Each shard's Raft group as this node sees it: leader, voters, learners (by node name), and
// the sites chosen to vote in the messages shards (`broker ctl ds set-replicas`).
async function shards(names) {
  let raft, chosen;
  try {
    [raft, chosen] = await Promise.all([
      api("GET", "/api/v5/raft"), api("GET", "/api/v5/ds/storages/messages/replicas"),
    ]);
  } catch (error) {
    if (error instanceof Unauthorized) throw error;
    return "";
  }
  const node = (site) => names.get(site) ?? site;
  const nodes = (sites) => sites.map(node).join(", ");
  const groups = raft.groups.filter((g) => g.name === "sessions" || g.name.startsWith("messages"));
  const placed = el("table", { id: "shards" });
  table(placed, ["Shard", "Leader", "Voters", "Learners", "Term", "Committed"], groups.map((g) =>
    el("tr", { "data-shard": g.name }, cell(g.name), cell(g.leader ? node(g.leader) : "none", "id"),
      cell(nodes(g.voters), "voters"), cell(nodes(g.learners), "learners"), cell(g.term),
      cell(g.commit))));
  return el("div", {}, el("h2", {}, "Replicas per shard"),
    el("p", { id: "chosen" }, `Voting in messages: ${nodes(chosen)}`),
    el("div", { class: "scroll" }, placed));
}

$("seal").addEventListener("click", async () => {
  try {
    const result = await api("POST", "/api/v5/ds/storages/messages/generations");
    notice(`Sealed ${result.sealed} generation(s).`);
  } catch (error) {
    if (!(error instanceof Unauthorized)) notice(error.message, true);
  }
  storage();
});

// ---- WebSocket client -------------------------------------------------------------------
let mqtt = null;
const received = [];

function wsStatus(text) {
  $("ws-status").textContent = text;
  $("ws-connect-button").textContent = mqtt ? "Disconnect" : "Connect";
}

// Set at once, not on the first refresh: the form cannot be submitted without it.
$("ws-connect").clientId.value = `dashboard-${Math.random().toString(16).slice(2, 10)}`;

async function websocketDefaults() {
  const form = $("ws-connect");
  if (form.url.value) return;
  const listeners = await api("GET", "/api/v5/listeners");
  const ws = listeners.find((l) => l.type === "ws" && l.running);
  const port = ws ? Number(ws.bind.split(":").pop()) : 0;
  if (port) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    form.url.value = `${scheme}://${location.hostname}:${port}${ws.websocket.mqtt_path}`;
  }
}

$("ws-connect").addEventListener("submit", (event) => {
  event.preventDefault();
  if (mqtt) {
    mqtt.disconnect();
    return;
  }
  const form = event.target;
  mqtt = new MqttClient(form.url.value, {
    onConnect: () => wsStatus("connected"),
    onClose: (reason) => { mqtt = null; wsStatus(reason); },
    onSuback: (id, codes) => {
      const span = $("ws-subscriptions");
      span.textContent = `${span.textContent} ${codes[0] >= 0x80 ? "refused" : "granted QoS " + codes[0]}`;
    },
    onMessage: (message) => {
      received.unshift(message);
      received.length = Math.min(received.length, 200);
      table("ws-messages", ["Topic", "QoS", "Retained", "Payload"], received.map((m) =>
        el("tr", {}, cell(m.topic, "id"), cell(m.qos), cell(m.retain ? "yes" : ""),
          cell(new TextDecoder().decode(m.payload), "id"))));
    },
  });
  wsStatus("connecting");
  mqtt.connect({
    clientId: form.clientId.value, username: form.username.value, password: form.password.value,
  });
});

$("ws-subscribe").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!mqtt) return notice("Connect first.", true);
  mqtt.subscribe(event.target.filter.value, Number(event.target.qos.value));
});

$("ws-publish").addEventListener("submit", (event) => {
  event.preventDefault();
  if (!mqtt) return notice("Connect first.", true);
  const form = event.target;
  mqtt.publish(form.topic.value, form.payload.value, Number(form.qos.value), form.retain.checked);
  notice(`Published to ${form.topic.value}.`);
});

// ---- alarms: a banner over every view while one is active ----------------------------------
async function alarms() {
  const active = (await api("GET", "/api/v5/alarms?activated=true")).data;
  const banner = $("alarms");
  banner.hidden = active.length === 0;
  banner.replaceChildren(...active.map((alarm) => el("p", { "data-alarm": alarm.name },
    el("strong", {}, alarm.name), ` on ${alarm.node} since ${alarm.activate_at}: `,
    alarm.message)));
}

// ---- routing and refresh ----------------------------------------------------------------
const VIEWS = {
  overview, clients, subscriptions, groups, topics, storage, websocket: websocketDefaults,
};

function route() {
  const name = location.hash.slice(1) in VIEWS ? location.hash.slice(1) : "overview";
  current = name;
  for (const section of document.querySelectorAll(".view")) {
    section.hidden = section.id !== `view-${name}`;
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.getAttribute("href") === `#${name}`);
  }
  refresh();
}

let refreshing = false;
async function refresh() {
  if (!token || refreshing) return;
  refreshing = true;
  try {
    await sample();
    await alarms();
    await VIEWS[current]();
  } catch (error) {
    if (!(error instanceof Unauthorized)) notice(error.message, true);
  } finally {
    refreshing = false;
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("resize", () => chart.draw());
setInterval(refresh, REFRESH_MS);
if (token) loggedIn(); else loggedOut();
