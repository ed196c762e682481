// The JavaScript context's process: node running this driver (node_context.py starts it); with
// "typescript" in argv[4], the TypeScript context's, which transpiles each cell first.
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
//
// A TypeScript cell is transpiled (Debian's node-typescript, ts.transpileModule: types are
// stripped, never checked) to the JavaScript that then runs as a JavaScript cell does. A script
// stays a script: no "use strict" prologue and no module wrapper unless the cell itself imports or
// exports, so its last expression is still the value of the cell. A syntax error the transpiler
// reports is the cell's error, a SyntaxError, and nothing of the cell runs.
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
const typescript = process.argv[4] === 'typescript' ? require('typescript') : null;
const stringify = JSON.stringify;
// ES2022 is what node 18 runs as it is (let, classes, async); CommonJS turns an import into a
// require of the context's own; no type check, no helpers from a tslib the sandbox does not have.
const TRANSPILE_OPTIONS = {
  target: 'ES2022',
  module: 'CommonJS',
  esModuleInterop: true,
  importHelpers: false,
  alwaysStrict: false,
  sourceMap: false,
  removeComments: false,
};

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

// A cell's TypeScript as JavaScript, or the SyntaxError of its first diagnostic.
function transpile(seq, code) {
  const fileName = `cell-${seq}.ts`;
  const out = typescript.transpileModule(code, {
    compilerOptions: typescript.convertCompilerOptionsFromJson(TRANSPILE_OPTIONS, '').options,
    fileName,
    reportDiagnostics: true,
  });
  const diagnostics = (out.diagnostics || []).filter(
    (d) => d.category === typescript.DiagnosticCategory.Error);
  if (diagnostics.length === 0) {
    return { js: out.outputText };
  }
  const first = diagnostics[0];
  const message = typescript.flattenDiagnosticMessageText(first.messageText, '\n');
  const lines = diagnostics.map((d) => {
    let where = fileName;
    if (d.file && d.start !== undefined) {
      const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
      where = `${fileName}:${line + 1}:${character + 1}`;
    }
    return `${where} - error TS${d.code}: ${typescript.flattenDiagnosticMessageText(d.messageText, '\n')}`;
  });
  return {
    error: { seq, type: 'error', name: 'SyntaxError', value: message, traceback: lines.join('\n') },
  };
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
    let source = code;
    if (typescript !== null) {
      const transpiled = transpile(seq, code);
      if (transpiled.error) {
        reply(transpiled.error);
        return;
      }
      source = transpiled.js;
    }
    const script = new vm.Script(source, { filename: `cell-${seq}` });
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
