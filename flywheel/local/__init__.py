"""The local executor behind `flywheel run`: supervisor, event folding, progress, report, fault flags."""
