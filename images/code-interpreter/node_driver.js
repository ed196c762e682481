// The JavaScript context's process: node running this driver (node_context.py starts it).
//
// Cells arrive as JSON lines on the fd in argv[2] ({seq, code, env}); what is not output goes
// back as JSON lines on the fd in argv[3]: {seq: 0, type: "ready"} once, then per cell
// {seq, type: "result", text}, {seq, type: "error", name, value, traceback} and {seq, type: "done"}.
// Every cell runs in one vm context, made once (with node's globals, require resolving from the
// cwd), so what a cell declares stays for the next. The value of the cell's last expression is
// its result: a string as it is, anything else as util.inspect shows it, undefined as none; a
// promise is awaited first. console and process.stdout/stderr write to this process's stdout and
// stderr, which the server streams (pipes are synchronous on Linux, so a cell's output is on its
// pipe before the cell's result or end is on the control fd). SIGINT stops a running cell (vm's
// breakOnSigint, or the wait for its promise) and never this process.
'use strict';

const fs = require('fs');
const net = require('net');
const path = require('path');
const readline = require('readline');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');

const requestFd = Number(process.argv[2]);
const replyFd = Number(process.argv[3]);
const stringify = JSON.stringify;

function reply(doc) {
  fs.writeSync(replyFd, stringify(doc) + '\n');
}

function makeContext() {
  const sandbox = {};
  for (const name of Object.getOwnPropertyNames(globalThis)) {
    if (!(name in sandbox) && name !== 'globalThis') {
      Object.defineProperty(sandbox, name, Object.getOwnPropertyDescriptor(globalThis, name));
    }
  }
  const context = vm.createContext(sandbox);
  const here = path.join(process.cwd(), '[cell]');
  context.require = createRequire(here);
  context.module = { exports: {}, require: context.require, filename: here };
  context.exports = context.module.exports;
  context.__filename = here;
  context.__dirname = process.cwd();
  return context;
}

const context = makeContext();
let stopWaiting = null;
process.on('SIGINT', () => {
  if (stopWaiting !== null) {
    stopWaiting(new Error('the cell was interrupted (SIGINT)'));
  }
});

// What a cell left running fails later, outside any cell: said on stderr, and this process lives on.
process.on('uncaughtException', (error) => {
  process.stderr.write(`Uncaught ${util.inspect(error)}\n`);
});
process.on('unhandledRejection', (reason) => {
  process.stderr.write(`Unhandled rejection ${util.inspect(reason)}\n`);
});

function asError(seq, thrown) {
  if (thrown !== null && typeof thrown === 'object' && 'message' in thrown) {
    const stack = String(thrown.stack || '')
      .split('\n')
      .filter((line) => !line.includes('node_driver.js') && !line.includes('node:vm') &&
                        !line.includes('node:internal'))
      .join('\n');
    return { seq, type: 'error', name: String(thrown.name || 'Error'), value: String(thrown.message), traceback: stack };
  }
  return { seq, type: 'error', name: 'Thrown', value: util.inspect(thrown), traceback: '' };
}

function settle(value) {
  return new Promise((resolve, reject) => {
    stopWaiting = reject;
    Promise.resolve(value).then(resolve, reject);
  }).finally(() => {
    stopWaiting = null;
  });
}

async function runCell(request) {
  const { seq, code } = request;
  const env = request.env || {};
  const saved = {};
  for (const name of Object.keys(env)) {
    saved[name] = Object.prototype.hasOwnProperty.call(process.env, name) ? process.env[name] : undefined;
    process.env[name] = env[name];
  }
  try {
    const script = new vm.Script(code, { filename: `cell-${seq}` });
    let value = script.runInContext(context, { breakOnSigint: true, displayErrors: false });
    if (value !== null && typeof value === 'object' && typeof value.then === 'function') {
      value = await settle(value);
    }
    if (value !== undefined) {
      reply({ seq, type: 'result', text: typeof value === 'string' ? value : util.inspect(value) });
    }
  } catch (thrown) {
    reply(asError(seq, thrown));
  } finally {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) {
        delete process.env[name];
      } else {
        process.env[name] = value;
      }
    }
    reply({ seq, type: 'done' });
  }
}

let queue = Promise.resolve();
// A socket, not fs.createReadStream: a read blocked in node's thread pool would hold its exit.
const requestPipe = new net.Socket({ fd: requestFd, readable: true, writable: false });
const requests = readline.createInterface({ input: requestPipe });
requests.on('line', (line) => {
  const request = JSON.parse(line);
  queue = queue.then(() => runCell(request));
});
requests.on('close', () => process.exit(0));
reply({ seq: 0, type: 'ready' });
