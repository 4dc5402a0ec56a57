"""What a load reports: one rank's figures and their wire form (:mod:`.figures`), the table and
JSON every rank can render after the exchange (:mod:`.render`), rank-0 progress (:mod:`.progress`),
host memory peaks (:mod:`.memory`) and a rank's log lines (:mod:`.log`). This face imports
nothing."""
