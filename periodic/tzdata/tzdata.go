// Package tzdata embeds the IANA time zone database in the program that
// imports it, so that schedules (durable.Schedule.TimeZone, and
// periodic.Parse) resolve their time zones on a machine without one: a
// scratch or distroless container has no /usr/share/zoneinfo, where
// time.LoadLocation fails, and durable.New then refuses a schedule with a
// time zone. Import it for its side effect, once, in the main package:
//
//	import _ "github.com/godurable/godurable/periodic/tzdata"
//
// It needs no build tag (-tags timetzdata does the same for a whole
// build). It adds about 450 KB to the binary, which is why godurable does
// not import it itself: a program whose machines have the system database
// does without. The system database, when there is one, still comes first
// (package time reads $ZONEINFO, then the system's, then the embedded one).
package tzdata

import _ "time/tzdata" // registers the embedded database with package time
