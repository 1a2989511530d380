"""Kernel-log watch: sources (journal, /dev/kmsg, saved files), the rule catalog and the classifier."""
