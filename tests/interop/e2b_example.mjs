// A script written for E2B's JavaScript SDK (`e2b` from npm), nothing callbox-specific in it.
// Run it against callbox with:
//   E2B_API_URL=http://127.0.0.1:PORT E2B_SANDBOX_URL=http://127.0.0.1:PORT \
//   E2B_API_KEY=YOUR-KEY node e2b_example.mjs
// (tests/interop/test_e2b_js.py runs it with the Node and the e2b that `make npm-tools` installs).

// README: e2b-js-example snippet start
import { Sandbox } from 'e2b'

const sandbox = await Sandbox.create({ metadata: { purpose: 'example' } })
try {
  const result = await sandbox.commands.run('echo Hello from $(uname -s)')
  console.log(result.stdout.trim())

  await sandbox.files.write('/home/user/greeting.txt', 'Hello, file!\n')
  console.log((await sandbox.files.read('/home/user/greeting.txt')).trim())
  console.log((await sandbox.commands.run('pwd')).stdout.trim())
  console.log((await sandbox.commands.run('wc -c < greeting.txt')).stdout.trim(), 'bytes')

  const listed = await Sandbox.list().nextItems()
  console.log('listed:', listed.some((info) => info.sandboxId === sandbox.sandboxId))
} finally {
  console.log('killed:', await sandbox.kill())
}
// README: e2b-js-example snippet end
