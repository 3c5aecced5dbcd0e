/// What a file presenter is told and asked: the callbacks of `NSFilePresenter`.
///
/// `didChange`, `didMove` and `accommodateDeletion` report what happened to the file. The other
/// three are asked by a coordinated access of a coordinator that is not this presenter's own,
/// in any process, before it takes the file, and the access waits for the answer:
/// `savePresentedItemChanges` before a read, then `relinquishToReader` before a read or
/// `relinquishToWriter` before a write. A relinquish callback returns what to run once that
/// access is over (the reacquirer), or `nil`.
///
/// A callback that coordinates an access to the presented file itself (a save writing it) must
/// do so with a coordinator made with this presenter, as `NSFileCoordinator`'s documentation
/// asks: any other coordinator would ask this presenter, which is busy in the callback, and
/// wait for its answer until the access's timeout.
public struct FilePresenterCallbacks: Sendable {
    /// Runs after the access that asked is over, in whatever way it ended (also when its process died).
    public typealias Reacquirer = @Sendable () -> Void

    /// The file's contents changed (`presentedItemDidChange`).
    public var didChange: (@Sendable () -> Void)?
    /// The file was renamed, by any process (`presentedItemDidMove(to:)`).
    public var didMove: (@Sendable (_ newPath: String) -> Void)?
    /// The file's last name was removed (`accommodatePresentedItemDeletion`).
    public var accommodateDeletion: (@Sendable () -> Void)?
    /// Save unsaved changes before another coordinator reads (`savePresentedItemChanges`).
    /// Throwing refuses the read: it fails with ``IPCError/Code/presenterFailed``.
    public var savePresentedItemChanges: (@Sendable () throws -> Void)?
    /// Another coordinator is about to read (`relinquishPresentedItem(toReader:)`).
    public var relinquishToReader: (@Sendable () -> Reacquirer?)?
    /// Another coordinator is about to write (`relinquishPresentedItem(toWriter:)`).
    public var relinquishToWriter: (@Sendable () -> Reacquirer?)?

    public init(
        didChange: (@Sendable () -> Void)? = nil,
        didMove: (@Sendable (_ newPath: String) -> Void)? = nil,
        accommodateDeletion: (@Sendable () -> Void)? = nil,
        savePresentedItemChanges: (@Sendable () throws -> Void)? = nil,
        relinquishToReader: (@Sendable () -> Reacquirer?)? = nil,
        relinquishToWriter: (@Sendable () -> Reacquirer?)? = nil
    ) {
        self.didChange = didChange
        self.didMove = didMove
        self.accommodateDeletion = accommodateDeletion
        self.savePresentedItemChanges = savePresentedItemChanges
        self.relinquishToReader = relinquishToReader
        self.relinquishToWriter = relinquishToWriter
    }

    /// Whether coordinated accesses in other processes must be able to ask this presenter.
    public var answersCoordinators: Bool {
        savePresentedItemChanges != nil || relinquishToReader != nil || relinquishToWriter != nil
    }
}

/// The contents of a file inside a coordinated read or write.
public protocol CoordinatedFileContents {
    /// The whole file.
    func contents() throws -> [UInt8]
    /// Makes `bytes` the whole file (a coordinated write only).
    func replaceContents(with bytes: [UInt8]) throws
}

/// A presenter of one file; it stops presenting at ``remove()``.
public protocol FilePresentation: AnyObject, Sendable {
    /// Where the presented file is (`presentedItemURL`): the path it was presented at, and
    /// after a rename by any process the new one, as `NSFilePresenter` follows its item;
    /// coordinated accesses at the new path ask the presenter from then on.
    var path: String { get }
    /// After it returns no callback starts again. Idempotent.
    func remove()
}

/// Coordinated reads and writes of files shared by processes: the counterpart of
/// `NSFileCoordinator`.
///
/// The contract the conformance suite (area 9) checks: a write excludes every other read and
/// write, in any process; before an access takes the file, the presenters of it that are not
/// the coordinator's own are asked (save, then relinquish) in every process and the access
/// waits for their answers until its timeout (then ``IPCError/Code/coordinationTimeout``); a
/// presenter whose process dies while asked stops counting at once; each reacquirer runs after
/// its access; ``cancel()`` fails the accesses pending when it is called with
/// `CancellationError`; a ``prepare(forReadingItemsAt:writingItemsAt:timeout:byAccessor:)``
/// batch asks each presenter once, however many accesses the batch makes.
public protocol FileCoordinating: Sendable {
    associatedtype Access: CoordinatedFileContents

    /// Runs `accessor` while no writer holds the existing file at `path`.
    func coordinate<T>(readingItemAt path: String, timeout: Duration, byAccessor accessor: (Access) throws -> T) throws -> T
    /// Runs `accessor` while nobody else reads or writes the file at `path` (created if missing).
    func coordinate<T>(writingItemAt path: String, timeout: Duration, byAccessor accessor: (Access) throws -> T) throws -> T
    /// Asks the presenters of all the files once, then runs `batch`, in which this
    /// coordinator's accesses to those files do not ask them again; reacquirers run after it.
    func prepare<T>(forReadingItemsAt reading: [String], writingItemsAt writing: [String], timeout: Duration, byAccessor batch: () throws -> T) throws -> T
    /// Fails this coordinator's accesses that are waiting now with `CancellationError`.
    func cancel()
}

/// An implementation of file presenters and coordinators, as the conformance suite sees it.
public protocol FileCoordinationSystem: Sendable {
    associatedtype Presenter: FilePresentation
    associatedtype Coordinator: FileCoordinating

    /// Starts presenting the existing file at `path`.
    func present(_ path: String, callbacks: FilePresenterCallbacks) throws -> Presenter
    /// A coordinator; with a presenter, its own accesses are neither reported to nor asked of
    /// that presenter (`NSFileCoordinator(filePresenter:)`).
    func coordinator(filePresenter: Presenter?) -> Coordinator
}
