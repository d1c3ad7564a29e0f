import sys

from kubeport.cli import main

sys.exit(main())
