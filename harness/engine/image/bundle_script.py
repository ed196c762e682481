"""The program that packs the agent bundle, run by the sandbox image's own Python inside a
throwaway container of that image (``bundle.build_bundle`` passes it with ``-c``).

It copies into ``OUT`` (argv[1], a host directory bind-mounted read-write):

- ``bin/python3``: the image's interpreter binary;
- ``lib/python3.X/``: its standard library (without the test suite, IDLE, Tk and the
  other parts an agent never imports) and ``lib-dynload``;
- ``agent/``: the agent's package and its dependencies (``/opt/callbox/lib``);
- ``so/``: every shared library that the interpreter and all those extension modules need,
  found with ``ldd``, and the dynamic loader itself;
- ``agent.py``: the entry script, and ``bundle.json``: the loader's name and the versions.

Only the standard library is used: this runs on the image's Python, not the harness's.
"""

from __future__ import annotations

BUNDLE_SCRIPT = r'''
import json, os, re, shutil, subprocess, sys, sysconfig

out = sys.argv[1]
agent_lib = sys.argv[2]
stdlib = sysconfig.get_paths()["stdlib"]
version = "python%d.%d" % sys.version_info[:2]
SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "distutils",
        "site-packages", "dist-packages", "__phello__"}
SKIP_PREFIX = ("config-",)

def ignore(directory, names):
    if os.path.realpath(directory) != os.path.realpath(stdlib):
        return []
    return [n for n in names if n in SKIP or n.startswith(SKIP_PREFIX) or n.endswith(".exe")]

os.makedirs(os.path.join(out, "bin"), exist_ok=True)
os.makedirs(os.path.join(out, "so"), exist_ok=True)
python = os.path.realpath(sys.executable)
shutil.copy2(python, os.path.join(out, "bin", "python3"))
shutil.copytree(stdlib, os.path.join(out, "lib", version), symlinks=False, ignore=ignore)
shutil.copytree(agent_lib, os.path.join(out, "agent"), symlinks=False)

elves = [python]
for root in (os.path.join(out, "lib", version, "lib-dynload"), os.path.join(out, "agent")):
    for directory, _, files in os.walk(root):
        elves += [os.path.join(directory, f) for f in files if ".so" in f]

loader = None
libraries = {}
missing = {}
line_re = re.compile(r"^\s*(\S+)\s+=>\s+(\S+)\s+\(0x[0-9a-f]+\)\s*$")
loader_re = re.compile(r"^\s*(/\S+)\s+\(0x[0-9a-f]+\)\s*$")
for elf in elves:
    result = subprocess.run(["ldd", elf], capture_output=True, text=True)
    if result.returncode != 0:
        continue
    for line in result.stdout.splitlines():
        if "not found" in line:
            missing.setdefault(line.split()[0], []).append(os.path.basename(elf))
        elif (m := line_re.match(line)):
            libraries[m.group(1)] = m.group(2)
        elif (m := loader_re.match(line)):
            loader = m.group(1)
if loader is None:
    sys.exit("ldd named no dynamic loader for " + python)
for name, path in sorted(libraries.items()):
    shutil.copy2(os.path.realpath(path), os.path.join(out, "so", name))
loader_name = os.path.basename(loader)
shutil.copy2(os.path.realpath(loader), os.path.join(out, "so", loader_name))

with open(os.path.join(out, "agent.py"), "w") as f:
    f.write('"""callbox agent entry point in the agent bundle."""\n'
            "import sys\n\n"
            "sys.path.insert(0, sys.prefix + '/agent')\n"
            "from sandbox.__main__ import main  # noqa: E402\n\n"
            "sys.exit(main())\n")
with open(os.path.join(out, "bundle.json"), "w") as f:
    json.dump({"loader": loader_name, "python": version, "libraries": sorted(libraries),
               "unresolved": missing}, f, indent=1, sort_keys=True)
subprocess.run([os.path.join(out, "so", loader_name), "--library-path", os.path.join(out, "so"),
                "--inhibit-cache", os.path.join(out, "bin", "python3"), "-I", "-S", "-m", "compileall", "-q",
                "--invalidation-mode", "unchecked-hash", os.path.join(out, "lib", version),
                os.path.join(out, "agent")], check=True, stdout=subprocess.DEVNULL)
'''
