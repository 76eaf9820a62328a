"""``python -m tilebin``: the command line (code in ``tilebin.runtime._cli``)."""

import sys

from tilebin.runtime._cli import main

if __name__ == "__main__":
    sys.exit(main())
