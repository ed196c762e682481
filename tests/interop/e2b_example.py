"""A script written for E2B, nothing callbox-specific in it. Run it against callbox with:

    E2B_API_URL=http://127.0.0.1:PORT E2B_SANDBOX_URL=http://127.0.0.1:PORT \\
    E2B_API_KEY=YOUR-KEY python e2b_example.py
"""

# README: e2b-example snippet start
from e2b import Sandbox

sandbox = Sandbox.create(metadata={"purpose": "example"})
try:
    result = sandbox.commands.run("echo Hello from $(uname -s)")
    print(result.stdout.strip())

    sandbox.files.write("/home/user/greeting.txt", "Hello, file!\n")
    print(sandbox.files.read("/home/user/greeting.txt").strip())
    print(sandbox.commands.run("pwd").stdout.strip())
    print(sandbox.commands.run("wc -c < greeting.txt").stdout.strip(), "bytes")

    listed = Sandbox.list().next_items()
    print("listed:", sandbox.sandbox_id in [info.sandbox_id for info in listed])
finally:
    print("killed:", sandbox.kill())
# README: e2b-example snippet end
