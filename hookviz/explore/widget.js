// hookviz.widget's front end: the explorer's pickers in a notebook cell. Every request is an /api/ path the
// kernel answers with the explorer's own routes (JSON in the message, a PNG in a buffer): no server, no URL.
function render({ model, el }) {
  let next = 0;
  const waiting = new Map();
  const onMessage = (msg, buffers) => {
    const done = waiting.get(msg.id);
    if (!done) return;
    waiting.delete(msg.id);
    done(msg, buffers || []);
  };
  model.on("msg:custom", onMessage);
  const ask = (path) => new Promise((resolve, reject) => {
    const id = ++next;
    waiting.set(id, (msg, buffers) => (msg.status >= 400 ? reject(new Error(msg.error || `error ${msg.status}`)) : resolve([msg, buffers])));
    model.send({ id, path });
  });
  const json = async (path) => (await ask(path))[0].json;
  const q = (o) => new URLSearchParams(o).toString();

  el.innerHTML = `
    <div class="hookviz-widget">
      <div class="pickers">
        <div class="title"></div>
        <label>photo <select data-pick="input"></select></label>
        <label>layer <select data-pick="layer"></select></label>
        <label>method <select data-pick="method"></select></label>
        <label>class <select data-pick="target"></select></label>
        <div class="status"></div>
      </div>
      <div class="view"><img alt="the map"><div class="caption"></div></div>
    </div>`;
  const pick = (name) => el.querySelector(`[data-pick="${name}"]`);
  const img = el.querySelector("img"), caption = el.querySelector(".caption"), status = el.querySelector(".status");
  el.querySelector(".title").textContent = model.get("title");
  const state = { input: "0", layer: "", method: "gradcam", target: "top1" };
  const fill = (select, options, chosen) => {
    select.replaceChildren(...options.map(([value, text]) => new Option(text, value, false, value === chosen)));
  };
  let shown = 0;
  // Each list's latest request: an answer to an older one (another photo picked meanwhile) is dropped.
  const latest = { classes: 0, layers: 0 };

  async function show() {
    const mine = ++shown;
    status.textContent = "";
    el.dataset.state = "busy";
    try {
      const view = q(state);
      const [msg, buffers] = await ask("/api/map?" + view);
      const info = await json("/api/map?" + q({ ...state, format: "json" }));
      if (mine !== shown) return;
      const old = img.src;
      img.src = URL.createObjectURL(new Blob([buffers[0]], { type: "image/png" }));
      if (old.startsWith("blob:")) URL.revokeObjectURL(old);
      const r = info.record, t = r.target || {}, p = r.predicted || {};
      caption.innerHTML = "";
      caption.append(`${r.method} @ ${r.layer}: ${t.name ?? "class " + t.index} (${t.index}) p=${(t.score ?? 0).toFixed(3)}` +
        `\npredicted ${p.name ?? p.index} p=${(p.score ?? 0).toFixed(3)}\n`);
      const code = document.createElement("code");
      code.textContent = info.command;
      caption.append(code);
      img.dataset.view = view;
      el.dataset.state = "shown";
    } catch (err) {
      if (mine === shown) { status.textContent = String(err.message || err); el.dataset.state = "error"; }
    }
  }

  async function classes() {
    const mine = ++latest.classes;
    const found = await json("/api/predict?" + q({ input: state.input, k: 10 }));
    if (mine !== latest.classes) return;
    const options = [["top1", "top class"], ...found.targets.map((t) => [String(t.index), `${t.name ?? t.index} (${t.index}) ${t.score.toFixed(3)}`])];
    if (!options.some(([v]) => v === state.target)) state.target = "top1";
    fill(pick("target"), options, state.target);
  }

  async function layers() {
    const mine = ++latest.layers;
    const found = await json("/api/layers?" + q({ input: state.input }));
    if (mine !== latest.layers) return;
    const options = found.map((l) => [l.default ? "" : l.name, `${l.name}${l.default ? " (default)" : ""} ${l.shape.join("x")}`]);
    fill(pick("layer"), options, state.layer);
  }

  async function start() {
    try {
      const inputs = await json("/api/inputs");
      fill(pick("input"), inputs.map((i) => [String(i.index), i.name]), state.input);
      const methods = (await json("/api/methods")).filter((m) => !m.why);
      fill(pick("method"), methods.map((m) => [m.name, m.title || m.name]), state.method);
      await layers();
      await classes();
      await show();
    } catch (err) {
      status.textContent = String(err.message || err);
      el.dataset.state = "error";
    }
  }

  for (const name of Object.keys(state)) {
    pick(name).addEventListener("change", async (event) => {
      state[name] = event.target.value;
      if (name === "input") { state.target = "top1"; await layers(); await classes(); }
      await show();
    });
  }
  start();
  return () => model.off("msg:custom", onMessage);
}

export default { render };
