from phalanx.entry import main

raise SystemExit(main())
