"""``python -m tools.kuberay_bed up|down`` (``make k8s-up`` / ``make k8s-down``)."""

import sys

from tools.kuberay_bed._cli import main

sys.exit(main(sys.argv[1:]))
