"""The model worker. Its start timings count from this package's first import (python -m worker),
which comes before every heavy import."""

import time

IMPORTED_AT = time.time()
