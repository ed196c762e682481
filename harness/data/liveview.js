// The console's live view: noVNC's RFB client (served from the sandbox's image by the console)
// drawing the desktop over the console's WebSocket. View-only unless the page says this operator
// took over; the console's proxy drops input from anyone else whatever this script does.
const screen = document.getElementById("live-screen");
const status = document.getElementById("live-status");

function say(state, text) {
  screen.dataset.state = state;
  status.textContent = text;
}

async function start() {
  const { default: RFB } = await import(new URL(screen.dataset.novnc + "core/rfb.js", location.href).href);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const rfb = new RFB(screen, `${scheme}//${location.host}${screen.dataset.socket}`, { wsProtocols: ["binary"] });
  rfb.viewOnly = screen.dataset.control !== "1";
  rfb.scaleViewport = true;
  rfb.addEventListener("connect", () => say("connected", rfb.viewOnly ? "connected, view-only" : "connected, in control"));
  rfb.addEventListener("disconnect", (event) => say("disconnected", event.detail.clean ? "disconnected" : "connection lost"));
}

start().catch((error) => say("failed", `the live view could not start: ${error}`));
