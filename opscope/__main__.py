from opscope.cli import main

raise SystemExit(main())
