from vramlab.cli.main import main

raise SystemExit(main())
