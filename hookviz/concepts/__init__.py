"""What a channel means: its best inputs over a data set (:mod:`.examples`, :mod:`.dataset`)."""
