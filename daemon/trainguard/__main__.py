from trainguard.cli import main

raise SystemExit(main())
