from phalanx.cli.entry import main

raise SystemExit(main())
