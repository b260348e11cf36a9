"""The packaged tables (.csv.gz), their sources and licences (PROVENANCE.md), and how to rebuild them."""
