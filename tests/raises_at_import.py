"""A task module that raises RuntimeError when imported (a stale PGQUEUE_PERIODIC entry
after a deploy): the checks report its entry and the sweeper skips it."""

raise RuntimeError("settings for the old reports app are gone")
