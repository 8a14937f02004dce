"""Never imports torch: must behave exactly as without gpuwatch."""

import sys

print("argv", sys.argv[1:], "instrument hooks seen:", "torch" in sys.modules)
print("sitecustomize:", getattr(sys.modules.get("sitecustomize"), "MARK", None))
sys.stderr.write("to stderr\n")
sys.exit(3)
