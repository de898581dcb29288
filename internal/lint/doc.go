// Package lint holds the repository's lint test: the checks a reviewer
// would otherwise run by hand, as one go test target, in the style of
// pebble's internal/lint.
//
// TestLint runs, from the module root:
//
//   - gofmt: every Go file is formatted as gofmt would (go/format, in
//     process, so no binary is needed);
//   - go vet ./...;
//   - go mod tidy -diff: go.mod and go.sum list exactly what the build and
//     its tests import, direct requirements not marked indirect;
//   - staticcheck, pinned as a tool dependency in go.mod (go tool
//     staticcheck), so it runs offline once the module cache is filled;
//   - the contract assertions: every transport interface that a type of a
//     provider package implements is named in a var _ transport.X = (*T)(nil)
//     line, so a contract change breaks the provider's build, not a
//     conformance run.
//
// TestImportRules checks the package dependency rules (who may import
// whom), reading only import lines. TestDocLinks checks that every
// docs/<file>.md#<heading> a comment or document cites exists, so the
// citations of docs/verbs.md and docs/registration.md stay true.
// TestLayout checks docs/layout.md, the table of every non-test Go file
// and what it holds, against the tree: a file without a row, or a row for a
// file that is gone, fails it with one line naming the file.
// TestFileLength fails for a non-test Go file over 650 lines unless its
// entry in longFiles gives the reason it is one file.
//
// The tool-driven checks skip with a one-line reason when the tool cannot
// run (no go command, no module cache offline) and under the race detector,
// where they would only repeat the plain run's verdict at several times the
// cost. A finding always fails.
package lint
