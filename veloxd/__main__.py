from veloxd.cli import main

raise SystemExit(main())
