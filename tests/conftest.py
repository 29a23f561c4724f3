"""Settings shared by every test module.

The Ray clusters the tests start (tests/test_distributed*.py) live on
loopback addresses only; they use no token authentication (nothing outside
this machine can reach them) and send no usage reports. Set before Ray is
imported.
"""

import os

os.environ.setdefault('RAY_AUTH_MODE', 'disabled')
os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
